"""REAL: the async and sync engines on this CPU return what the reference engine returns.

Same prompts through three engines (reference: one process; async: attention replicas and expert
workers; sync: DP attention + EP experts), all in flight at once, token budget small enough that
long prompts are chunked. Compared per prompt: the first token (must be equal), the logits and
every layer's KV (max absolute difference, within the exactness tests' tolerances).
"""
from __future__ import annotations

import time

import torch

import asap
from asap.demo.settings import DemoSettings

# "async = sync = reference within 1e-4" (fp32), the KV held to the same bound: chunked prefill sums in
# another order than the reference's single pass. One run on a loaded machine measured a KV difference of
# 8.6e-5 (|KV| <= ~4.4; not reproduced in later runs, where it stays below 1e-6); the maximum is printed.
LOGITS_TOL = 1e-4
KV_TOL = 1e-4
ENGINES = {"async": dict(attention_workers=2, expert_workers=2), "sync": dict(devices=2)}


def prompts_for(lengths, vocab_size: int, seed: int = 0) -> list[list[int]]:
    g = torch.Generator().manual_seed(seed)
    return [torch.randint(0, vocab_size, (n,), generator=g).tolist() for n in lengths]


def compare(outs, ref) -> dict:
    return {"first_tokens_equal": all(o.first_token == r.first_token for o, r in zip(outs, ref)),
            "max_logits_diff": max((o.logits - r.logits).abs().max().item() for o, r in zip(outs, ref)),
            "max_kv_diff": max((a[k] - b[k]).abs().max().item() for o, r in zip(outs, ref)
                               for a, b in zip(o.kv, r.kv) for k in b)}


def run_real(s: DemoSettings, log) -> dict:
    t0 = time.monotonic()
    with asap.LLM(s.real_model, engine="reference") as llm:
        prompts = prompts_for(s.real_lengths, llm.cfg.vocab_size)
        ref = llm.prefill(prompts)
    out = {"model": s.real_model, "prompt_lengths": list(s.real_lengths), "token_budget": s.real_token_budget,
           "engines": {}}
    for name, kw in ENGINES.items():
        log(f"REAL: {name} engine ({', '.join(f'{k}={v}' for k, v in kw.items())})")
        with asap.LLM(s.real_model, engine=name, token_budget=s.real_token_budget, **kw) as llm:
            futures = [llm.submit(p) for p in prompts]          # all in flight at once
            outs = [f.result(timeout=300) for f in futures]
        c = compare(outs, ref)
        c["exact"] = c["first_tokens_equal"] and c["max_logits_diff"] < LOGITS_TOL and c["max_kv_diff"] < KV_TOL
        out["engines"][name] = {**kw, **c}
    out["exact"] = all(e["exact"] for e in out["engines"].values())
    out["wall_s"] = time.monotonic() - t0
    return out


def format_real(r: dict) -> list[str]:
    lines = [f"{len(r['prompt_lengths'])} prompts of {', '.join(map(str, r['prompt_lengths']))} tokens on "
             f"{r['model']} (token budget {r['token_budget']}: long prompts are chunked), all in flight at once",
             f"{'engine':<28}{'first tokens':>14}{'max |logits diff|':>20}{'max |KV diff|':>16}  verdict"]
    for name, e in r["engines"].items():
        layout = f"{e['attention_workers']}A+{e['expert_workers']}E" if name == "async" else f"{e['devices']} ranks"
        lines.append(f"{name + ' (' + layout + ')':<28}{'equal' if e['first_tokens_equal'] else 'DIFFER':>14}"
                     f"{e['max_logits_diff']:>20.2e}{e['max_kv_diff']:>16.2e}  "
                     f"{'EXACT' if e['exact'] else 'NOT EXACT'}")
    lines.append(f"verdict: {'EXACT' if r['exact'] else 'NOT EXACT'} (against the reference engine; tolerances "
                 f"max absolute difference, logits {LOGITS_TOL:g}, KV {KV_TOL:g}; {r['wall_s']:.0f} s)")
    return lines
