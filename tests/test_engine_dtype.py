"""dtype "auto" (vLLM's default): asap.LLM and `asap serve` run in the checkpoint's torch_dtype unless told
otherwise; the presets declare float32, so every fp32 comparison elsewhere still runs in fp32."""
import json

import pytest
import torch

import asap
from asap.engine.llm import parse_dtype
from asap.model.materialize import materialize
from asap.server.config import ServerConfig

PROMPTS = [[5, 6, 7, 8], list(range(1, 60))]


@pytest.fixture(scope="module")
def bf16_dir(tmp_path_factory):
    """tiny-deepseek-v3's weights under a config that says `torch_dtype: bfloat16`, as real checkpoints do."""
    out = materialize("tiny-deepseek-v3", tmp_path_factory.mktemp("bf16") / "m")
    hf = json.loads((out / "config.json").read_text())
    hf.pop("dtype")
    (out / "config.json").write_text(json.dumps(dict(hf, torch_dtype="bfloat16")))
    return out


def test_a_bfloat16_checkpoint_runs_in_bfloat16_by_default_and_float32_overrides(bf16_dir):
    with asap.LLM(str(bf16_dir), engine="reference") as auto, \
            asap.LLM(str(bf16_dir), engine="reference", dtype="float32") as fp32:
        assert (auto.dtype, fp32.dtype) == (torch.bfloat16, torch.float32)
        a, f = auto.prefill(PROMPTS), fp32.prefill(PROMPTS)
    for x, y in zip(a, f):
        assert x.kv[0]["kv_latent"].dtype == torch.bfloat16 and y.kv[0]["kv_latent"].dtype == torch.float32
        assert x.logits.dtype == y.logits.dtype == torch.float32          # logits are returned in fp32 either way
        assert 0 < (x.logits - y.logits).abs().max().item() < 0.5        # bf16 rounding: different, but close


LAYOUTS = {"async": dict(attention_workers=1, expert_workers=1), "sync": dict(devices=2)}


@pytest.mark.timeout(300)
@pytest.mark.parametrize("engine", LAYOUTS)
def test_the_workers_get_the_checkpoint_dtype(bf16_dir, engine):
    """The KV comes back from the attention workers (sync ranks): its dtype is what they loaded and computed in."""
    with asap.LLM(str(bf16_dir), engine="reference") as ref:
        want = ref.prefill(PROMPTS)
    with asap.LLM(str(bf16_dir), engine=engine, **LAYOUTS[engine]) as llm:
        assert llm.dtype == torch.bfloat16
        got = [f.result(timeout=240) for f in [llm.submit(p) for p in PROMPTS]]
    for g, w in zip(got, want):
        assert g.kv[0]["kv_latent"].dtype == torch.bfloat16
        assert (g.logits - w.logits).abs().max().item() < 0.1     # same bf16 math, other batching
    with asap.LLM(str(bf16_dir), engine=engine, dtype="float32", **LAYOUTS[engine]) as llm:
        assert llm.dtype == torch.float32
        assert llm.prefill(PROMPTS[:1])[0].kv[0]["kv_latent"].dtype == torch.float32


def test_presets_stay_float32_and_bad_dtypes_are_refused():
    with asap.LLM("tiny-deepseek-v3", engine="reference") as llm:
        assert llm.dtype == torch.float32
    assert parse_dtype("auto") is None and parse_dtype(None) is None
    assert parse_dtype(torch.bfloat16) == torch.bfloat16 and parse_dtype("float16") == torch.float16
    assert parse_dtype("half") == torch.float16 and parse_dtype("float") == torch.float32      # vLLM's aliases
    for bad in ("float8", "fp32", torch.int8, 32):
        with pytest.raises(ValueError, match="dtype must be one of auto, float32, bfloat16, float16"):
            parse_dtype(bad)
    assert ServerConfig().dtype == "auto"
