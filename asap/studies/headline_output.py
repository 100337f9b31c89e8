"""What `asap sim headline` writes (every figure SIMULATED): a row as printed lines (`format_row`), the
headline as JSON and a plot (`write_headline`, `merge_headlines`), and Perfetto traces of one instance of
each engine's best at the row's rate (`write_traces`). Output only: what a row finds is
asap.studies.headline's."""
from __future__ import annotations

import dataclasses
import json
from pathlib import Path

from asap.measure.buckets import format_buckets
from asap.sim.run import run
from asap.sim.trace_export import write_trace
from asap.studies.config import EngineConfig
from asap.studies.experiments import at_rate
from asap.studies.space import QUEUE_ORDERS
from asap.workload.presets import workload_requests

LABEL = "SIMULATED"


def format_row(row: dict) -> str:
    def one(e):
        r = row[e]
        if r["max_slo_rate"] is None:
            return f"{e}: no valid rate ({r['reason']})"
        hit = r.get("prefix_hit_rate")
        cache = "" if hit is None else f", prefix cache: on, hit rate {hit:.1%}"
        held = "" if r.get("search_rate") is None else \
            f", sustained on {r['num_requests']} requests ({r['search_rate']:.3f} on the search's sample)"
        return (f"{e} {r['max_slo_rate']:.3f} req/s ({r['tokens_per_s_per_device']:.0f} tok/s/device, P90 TTFT "
                f"{r['ttft_p90_s']:.3g} s{cache}{held}) [{r['describe']}]")
    ratio = "n/a" if row["ratio"] is None else f"{row['ratio']:.2f}x"
    scales = ", ".join(f"x{k}: {'n/a' if v is None else f'{v:.2f}x'}" for k, v in row["ratio_by_slo_scale"].items())
    lines = [f"[{LABEL}] {row['workload']}, {row['devices']} devices: async/sync = {ratio} (SLO scales {scales})",
             f"[{LABEL}]   {one('sync')}", f"[{LABEL}]   {one('async')}"]
    if row.get("ratio_by_target"):
        lines.append(f"[{LABEL}]   ratio at " + " / ".join(f"{float(k):.0%}" for k in row["ratio_by_target"])
                     + " of requests within SLO: " + " / ".join(_x(v["ratio"]) for v in row["ratio_by_target"].values())
                     + "  (rates: " + "; ".join(f"{float(k):.0%} sync {_r(v['sync'])} async {_r(v['async'])}"
                                               for k, v in row["ratio_by_target"].items()) + ")")
    if "ratio_every_bucket" in row:
        eb = {e: row[e]["every_bucket"] for e in ("sync", "async")}
        lines.append(f"[{LABEL}]   >= 90% in every prompt-length bucket: async/sync = {_x(row['ratio_every_bucket'])}"
                     + "".join(f"; {e} {_r(eb[e]['max_slo_rate'])} req/s [{eb[e]['describe'] or eb[e]['reason']}]"
                               for e in eb))
    if row.get("compared"):
        c = row["compared"]
        lines.append(f"[{LABEL}]   by prompt length, both at {c['rate']:.3f} req/s (first {c['num_requests']} "
                     f"requests):")
        for e in ("sync", "async"):
            lines.append(f"[{LABEL}]     {e:<5} {format_buckets(c[e]['buckets'])}")
    return "\n".join(lines)


def _x(v) -> str:
    return "n/a" if v is None else f"{v:.2f}x"


def _r(v) -> str:
    return "-" if v is None else f"{v:.3f}"


def write_traces(row, base_slo, workload, num_requests, model, hardware, out_dir, trace_s) -> None:
    rate = row["async"]["max_slo_rate"]
    if not rate:
        return
    n = row["async"]["num_requests"] or num_requests
    base = base_slo.apply(workload_requests(workload, n))
    for engine in ("sync", "async"):
        cfg = row[engine]["config"]
        if cfg is None:
            continue
        c = EngineConfig(**cfg)
        # a trace shows one instance: its share of the requests and of the rate
        reqs = at_rate(base[: max(2, len(base) // c.instances)], rate / c.instances)
        mid = reqs[len(reqs) // 2].arrival
        one = dataclasses.replace(c, instances=1)
        res = run(reqs, one.spec(model, hardware, row["devices"] // c.instances, trace_window=(mid, mid + trace_s)))
        write_trace(res.spans, Path(out_dir) / f"trace_{engine}_{row['devices']}.json")


def write_headline(out: dict, out_dir: "str | Path") -> None:
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    d = Path(out_dir)
    d.mkdir(parents=True, exist_ok=True)
    (d / "headline.json").write_text(json.dumps(out, indent=2, default=str) + "\n")
    fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(11, 4))
    for i, wl in enumerate(out["workloads"]):
        rows = [r for r in out["rows"] if r["workload"] == wl]
        devs = [r["devices"] for r in rows]
        for engine, style in (("sync", "--"), ("async", "-")):
            ax1.plot(devs, [r[engine]["tokens_per_s_per_device"] or float("nan") for r in rows], "o" + style,
                     color=f"C{i}", label=f"{wl} {engine}")
        ax2.plot(devs, [r["ratio"] or float("nan") for r in rows], "o-", color=f"C{i}", label=wl)
    ax1.set(xscale="log", xlabel="devices", ylabel="SLO-compliant input tokens/s per device",
            title=f"{LABEL}: best-tuned, {out['model']} on {out['hardware']}")
    ax2.axhline(1.0, color="gray", lw=0.8)
    ax2.set(xscale="log", xlabel="devices", ylabel="async / sync (best-tuned each)",
            title=f"{LABEL}: SLO {out['slo']}")
    for ax in (ax1, ax2):
        ax.legend(fontsize=7)
        ax.minorticks_off()
        devs = sorted({r["devices"] for r in out["rows"]})
        ax.set_xticks(devs, [str(x) for x in devs])
    fig.tight_layout()
    fig.savefig(d / "headline.png", dpi=120)
    plt.close(fig)


def merge_headlines(dirs, out_dir: "str | Path") -> dict:
    """One headline (JSON + plot) from runs that each covered some workloads (e.g. run in parallel)."""
    def read(d):
        done, part = Path(d) / "headline.json", Path(d) / "headline.partial.json"
        return json.loads((done if done.is_file() else part).read_text())
    parts = [read(d) for d in dirs]
    if not parts:
        raise ValueError("nothing to merge")
    keys = {(p["model"], p["hardware"], p["slo"], p.get("prefix_cache", False), str(p.get("sustained", False)),
             tuple(p.get("fleet_fractions", (0.5,))), tuple(p.get("orders", QUEUE_ORDERS)),
             str(p.get("lanes", []))) for p in parts}
    if len(keys) != 1:
        raise ValueError("headlines to merge differ in model / hardware / SLO / prefix cache / search rule / fleet "
                         f"shares / queue orders / lanes: {sorted(keys)}")
    out = dict(parts[0], workloads=[w for p in parts for w in p["workloads"]], rows=[r for p in parts for r in p["rows"]],
               wall_s=sum(p["wall_s"] for p in parts), merged_from=[str(d) for d in dirs],
               partial=any(p.get("partial") for p in parts))
    write_headline(out, out_dir)
    return out
