"""The `asap ablation` table: rows of asap.bench.ablation.ablation()'s result, with the settings stated."""
from __future__ import annotations

from asap.measure.report import cell, text_table
from asap.workload.slo import IdleMultiple, parse_slo


def format_ablation(res: dict) -> str:
    s, ref = res["settings"], res["ref_rate"]
    head = ["configuration", "SLO req/s", "tok/s/device", "vs plain", f"P90 TTFT ms @{ref:.3g}/s",
            f"attain @{ref:.3g}/s"]
    table = [head] + [[r["label"], f"{r['max_slo_rate']:.3f}" + ("" if r["converged"] else "*"),
                       f"{r['tokens_per_s_per_device']:.0f}", cell(r["vs_plain"], ".2f") + "x",
                       cell(r["ttft_p90_ms_at_ref"], ".0f"), cell(r["attainment_at_ref"], ".2f")]
                      for r in res["rows"]]
    lines = text_table(table)
    emulated = s["backend"] == "emulated"
    label = res["label"]
    what = (f"real worker processes, compute = cost-model waits on {s['hardware']} run x{s['dilation']:g} slower "
            f"(rates and TTFTs below are wall clock / {s['dilation']:g})" if emulated
            else f"discrete-event simulator on {s['hardware']}")
    notes = [f"[{label}] asap ablation: {s['model']}, {what}; sync {s['devices']} ranks, async "
             f"A={res['attention_workers']} + E={res['expert_workers']}",
             f"workload: {res['num_requests']} requests, Mooncake conversation lengths (mean "
             f"{res['mean_prompt_tokens']:.0f} tokens, x{s['length_scale']:g}, max {s['max_prompt'] or 'none'}), "
             f"{s['workload']} arrivals, seed {s['seed']}; SLO {s['slo']} ({_slo_words(s['slo'])}); token budget "
             f"{s['token_budget']}",
             f"policies when on: redundant experts +{s['redundant']}/layer, aggregation window {s['window_ms']:g} ms, "
             f"admission demote at slack {s['admission_slack']:g}; expert skew: "
             + ("none (the emulated runtime routes uniformly)" if emulated else f"Zipf {s['zipf']:g}"),
             f"SLO req/s: highest rate with >= {s['target']:.0%} of requests in SLO (find_max_rate, within "
             f"{s['tolerance']:.0%}; * = search not converged); P90 TTFT and attainment at {ref:.3g} req/s"
             + (" (given)" if s["ref_rate"] else " (the plain async row's SLO rate)"),
             *lines, f"({label}; {res['wall_s']:.0f} s)"]
    if any(r["unbounded"] for r in res["rows"]):
        notes.append("WARNING: a row met the SLO at every rate tried (its requests drain within the SLO even "
                     "arriving at once): its SLO rate is unbounded; use more requests or a tighter SLO")
    return "\n".join(notes)


def _slo_words(slo: str) -> str:
    spec = parse_slo(slo, relative=True)
    if isinstance(spec, IdleMultiple):
        return f"TTFT <= {spec.factor:g} x the idle sync TTFT of max(L, token budget) tokens"
    per_token = f" + {spec.per_token_s * 1e3:g} ms x prompt tokens" if spec.per_token_s else ""
    return f"TTFT <= {spec.fixed_s:g} s{per_token}"
