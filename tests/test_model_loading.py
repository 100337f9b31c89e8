"""Configs, presets, sliced loading, dtypes (issue: foundation, points 2, 3, 8, 9)."""
import json

import pytest
import torch

import asap
from asap.config import ModelConfig
from asap.model.loader import Checkpoint, load_attention_side, load_expert_shard
from asap.model.presets import PRESETS


def test_unknown_model_type_names_the_supported_ones(tmp_path):
    (tmp_path / "config.json").write_text(json.dumps({"model_type": "llama"}))
    with pytest.raises(ValueError, match="deepseek_v3, glm4_moe, qwen3_moe"):
        ModelConfig.from_dir(tmp_path)


def test_full_size_configs_have_the_published_parameter_counts():
    assert ModelConfig.from_hf(PRESETS["deepseek-v3"]).num_params()["total"] / 1e9 == pytest.approx(671, abs=1)
    q = ModelConfig.from_hf(PRESETS["qwen3-235b-a22b"])
    assert q.num_params()["total"] / 1e9 == pytest.approx(235, abs=1)
    assert all(q.moe_layers) and q.num_layers == 94


def test_qwen3_sparse_step_and_mlp_only_layers():
    cfg = ModelConfig.from_hf(dict(PRESETS["tiny-qwen3-moe"], num_hidden_layers=6, decoder_sparse_step=2,
                                   mlp_only_layers=[3]))
    assert cfg.moe_layers == (False, True, False, False, False, True)


def test_slices_read_only_their_tensors(tiny_dirs, monkeypatch):
    read = []
    orig = Checkpoint.iter
    monkeypatch.setattr(Checkpoint, "iter", lambda self, names, *a: (read.extend(names), orig(self, names, *a))[1])
    shard = load_expert_shard(tiny_dirs["tiny-deepseek-v3"], [3, 1])
    assert shard.expert_ids == {1: [1, 3], 2: [1, 3]}
    assert all(".mlp.experts.1." in n or ".mlp.experts.3." in n for n in read)
    read.clear()
    side = load_attention_side(tiny_dirs["tiny-deepseek-v3"])
    assert read and not any(".mlp.experts." in n for n in read)
    assert "mlp.gate.weight" in side.layers[1] and "mlp.gate_up" in side.layers[0]


def test_presets_are_real_hf_directories_with_several_shards(tiny_dirs, tmp_path):
    from asap.model.materialize import materialize
    out = materialize("tiny-qwen3-moe", tmp_path / "m", shard_bytes=100_000)
    index = json.loads((out / "model.safetensors.index.json").read_text())
    assert len(set(index["weight_map"].values())) > 1
    with asap.LLM(str(out)) as a, asap.LLM("tiny-qwen3-moe") as b:    # same seed, same weights
        assert torch.equal(a.prefill([[1, 2, 3]])[0].logits, b.prefill([[1, 2, 3]])[0].logits)


def test_bfloat16_runs_and_stays_close_to_float32():
    prompt = list(range(1, 200))
    with asap.LLM("tiny-deepseek-v3", dtype="bfloat16") as b, asap.LLM("tiny-deepseek-v3") as f:
        lb, lf = b.prefill([prompt])[0], f.prefill([prompt])[0]
    assert lb.logits.dtype == torch.float32 and lb.kv[0]["kv_latent"].dtype == torch.bfloat16
    assert (lb.logits - lf.logits).abs().max().item() < 0.1


def test_reference_engine_rejects_bad_prompts_and_stays_usable():
    with asap.LLM("tiny-deepseek-v3") as llm:
        with pytest.raises(ValueError, match="prompt 2: empty"):
            llm.prefill([[1], [2], []])
        with pytest.raises(ValueError, match="dtype must be"):
            asap.LLM("tiny-deepseek-v3", dtype="float8")
        with pytest.raises(ValueError, match="unknown engine"):
            asap.LLM("tiny-deepseek-v3", engine="fast")
        assert len(llm.prefill([[1], [2]])) == 2


def test_cached_preset_written_from_an_older_preset_is_rewritten(tmp_path, monkeypatch):
    from asap.model.materialize import resolve_model
    from asap.model.presets import preset_config
    monkeypatch.setenv("ASAP_CACHE", str(tmp_path))
    first = resolve_model("tiny-qwen3-moe")
    index = first / "model.safetensors.index.json"
    stamp = index.stat().st_mtime_ns
    assert resolve_model("tiny-qwen3-moe") == first and index.stat().st_mtime_ns == stamp   # current: reused
    old = json.loads((first / "config.json").read_text())
    (first / "config.json").write_text(json.dumps(dict(old, num_experts_per_tok=2)))       # an older preset
    again = resolve_model("tiny-qwen3-moe")
    written = json.loads((again / "config.json").read_text())
    assert written["num_experts_per_tok"] == preset_config("tiny-qwen3-moe")["num_experts_per_tok"]
    assert sorted(p.name for p in tmp_path.joinpath("models").iterdir()) == ["tiny-qwen3-moe"]


def test_block_fp8_preset_is_stored_in_fp8_and_approximates_the_preset(tmp_path):
    """`asap make-model --fp8`: e4m3 weights with per-block scales (kept FP8 in memory: tests/test_model_fp8.py);
    the logits stay within fp8's rounding of the unquantised preset's (same seed)."""
    from safetensors import safe_open
    from asap.model.materialize import materialize
    out = materialize("tiny-deepseek-v3", tmp_path / "fp8", fp8_block=(16, 16))
    with safe_open(out / "model-00001.safetensors", "pt") as f:
        w = f.get_tensor("model.layers.1.self_attn.q_b_proj.weight")
        assert w.dtype == torch.float8_e4m3fn
        assert f.get_tensor("model.layers.1.self_attn.q_b_proj.weight_scale_inv").shape == (6, 2)
        assert f.get_tensor("model.embed_tokens.weight").dtype == torch.float32
    prompt = list(range(1, 300))
    with asap.LLM(str(out)) as a, asap.LLM("tiny-deepseek-v3") as b:
        la, lb = a.prefill([prompt])[0].logits, b.prefill([prompt])[0].logits
    assert torch.nn.functional.cosine_similarity(la, lb, dim=0).item() > 0.999
    assert 0 < (la - lb).abs().max().item() < 0.05
