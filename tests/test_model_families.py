"""The model registry: one module per family, and nothing else branches on the family (issue 12, points 1, 7)."""
import math
import re
from pathlib import Path

import pytest

from asap.config import ModelConfig
from asap.cost.ops import attention_shape
from asap.model.families import FAMILIES, get_family
from asap.model.presets import CONFIG_ONLY, PRESETS

ASAP = Path(__file__).parent.parent / "asap"
_BRANCH = re.compile(r"\.is_mla\b|model_type\s*(==|!=|\bin\b)|[\"'](%s)[\"']" % "|".join(FAMILIES))


def test_nothing_outside_a_family_module_branches_on_the_family():
    offenders = []
    for f in ASAP.rglob("*.py"):
        rel = f.relative_to(ASAP).as_posix()
        if rel.startswith("model/families/"):
            continue
        for i, line in enumerate(f.read_text().splitlines(), 1):
            if _BRANCH.search(line) and "def is_mla" not in line:
                offenders.append(f"{rel}:{i}: {line.strip()}")
    assert offenders == []


def test_every_preset_belongs_to_a_registered_family_and_parses():
    assert set(FAMILIES) == {"deepseek_v3", "qwen3_moe", "glm4_moe"}
    for name, hf in PRESETS.items():
        cfg = ModelConfig.from_hf(hf)
        assert cfg.family is get_family(hf["model_type"]) and name in cfg.family.presets
        assert ModelConfig.unread_fields(hf) == []
    assert {"tiny-glm4-moe", "small-glm4-moe"} <= set(PRESETS) - CONFIG_ONLY
    assert {"glm-4.5", "glm-4.5-air", "deepseek-v3", "qwen3-235b-a22b"} <= CONFIG_ONLY


@pytest.mark.parametrize("preset", ["tiny-deepseek-v3", "tiny-qwen3-moe", "tiny-glm4-moe", "glm-4.5"])
def test_kv_layout_and_cost_parameters_come_from_the_family(preset):
    cfg = ModelConfig.from_hf(PRESETS[preset])
    a, shape = cfg.attention_cost(), attention_shape(cfg)
    cached = sum(math.prod(dims) for dims in cfg.kv_cache_dims.values())
    assert a.kv_cache_elems == cached                       # the cost model's KV size is the cache's
    assert shape.core_flops_per_pair == 2 * a.heads * (a.qk_head_dim + a.v_head_dim)
    assert shape.kv_bytes_per_ctx == a.kv_heads * (a.qk_head_dim + a.v_head_dim) * 2
    tensors = cfg.family.attention_tensors(cfg)
    assert all(n in tensors for n in a.token_weights + a.context_weights)
    assert a.params == sum(math.prod(s) for s in tensors.values())


def test_glm45_geometry_in_the_cost_model():
    cfg = ModelConfig.from_hf(PRESETS["glm-4.5"])
    a = cfg.attention_cost()
    assert (a.heads, a.kv_heads, a.qk_head_dim, a.kv_layout) == (96, 8, 128, "gqa")
    assert a.proj_params == 5120 * 128 * (96 + 16) + 96 * 128 * 5120
    # q/k/v biases and q/k norms are attention parameters too
    assert a.params == a.proj_params + 128 * (96 + 16) + 2 * 128


def test_the_simulator_runs_glm45():
    from asap.scheduler.request import Request
    from asap.sim.run import simulate
    reqs = [Request(i, num_tokens=n, arrival=0.01 * i) for i, n in enumerate([512, 4096, 100, 2000, 8000, 300])]
    res = {m: simulate(reqs, "async", model_cfg=m, devices=32, token_budget=8192) for m in ("glm-4.5", "deepseek-v3")}
    assert all(r.ok and r.ttft > 0 for r in res["glm-4.5"])
    assert [r.ttft for r in res["glm-4.5"]] != [r.ttft for r in res["deepseek-v3"]]


def test_the_glm_preset_runs_on_every_engine_with_the_same_result():
    import torch
    import asap
    prompts = [[5, 6, 7], list(range(1, 400))]
    outs = {}
    for engine, kw in (("reference", {}), ("async", dict(attention_workers=1, expert_workers=1, token_budget=128)),
                       ("sync", dict(devices=2, token_budget=128))):
        with asap.LLM("tiny-glm4-moe", engine=engine, **kw) as llm:
            outs[engine] = llm.prefill(prompts)
    for engine in ("async", "sync"):
        for a, b in zip(outs[engine], outs["reference"]):
            assert a.first_token == b.first_token and (a.logits - b.logits).abs().max().item() < 1e-4
            assert all(torch.allclose(x[k], y[k], atol=1e-5) for x, y in zip(a.kv, b.kv) for k in y)
