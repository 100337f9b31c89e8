"""Real-checkpoint features match transformers on weights large enough to show errors (issue 12, point 8):
DeepSeek-V3 with the official YaRN settings, the same saved as block-FP8 (against transformers on the
dequantised weights), Qwen3-MoE block-FP8, Qwen3-MoE with YaRN, and GLM-4.5; through the reference engine
on prompts of 1 to 1500 tokens, and through one async (1:1) and one sync (N=2) run per family."""
import json

import pytest
import torch
from safetensors.torch import load_file, save_file

transformers = pytest.importorskip("transformers")

import asap  # noqa: E402
from asap.model.presets import preset_config  # noqa: E402

LENGTHS = [1, 23, 300, 1500]
STD = 0.1            # 5x transformers' default initializer_range: errors of a few percent show in the logits
DSV3_YARN = {"type": "yarn", "factor": 40, "beta_fast": 32, "beta_slow": 1, "mscale": 1.0, "mscale_all_dim": 1.0,
             "original_max_position_embeddings": 4096}
QWEN_YARN = {"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 1024}
BLOCK = [16, 24]     # several blocks per tiny matrix, with partial blocks at the edges (the official size is 128)
_CLASSES = {"deepseek_v3": "DeepseekV3", "qwen3_moe": "Qwen3Moe", "glm4_moe": "Glm4Moe"}
_NOT_QUANTISED = ("embed_tokens", "lm_head", "norm", "mlp.gate.", "e_score_correction_bias")


def _hf_config(preset: str, **changes):
    cfg = dict(preset_config(preset), initializer_range=STD, **changes)
    name = _CLASSES[cfg["model_type"]]
    return getattr(transformers, f"{name}Config")(**{k: v for k, v in cfg.items()
                                                      if k not in ("model_type", "architectures")}), name


def _hf_model(preset: str, out, **changes):
    config, name = _hf_config(preset, **changes)
    torch.manual_seed(0)
    model = getattr(transformers, f"{name}ForCausalLM")(config).eval()
    with torch.no_grad():       # HF initialises norms to 1 and the correction bias to 0: perturb so they are tested
        for n, p in model.named_parameters():
            if "norm" in n:
                p.add_(0.1 * torch.randn_like(p))
            elif n.endswith(".bias"):
                p.copy_(STD * torch.randn_like(p))
        for n, b in model.named_buffers():
            if "e_score_correction_bias" in n:
                b.copy_(0.05 * torch.randn_like(b))
    model.save_pretrained(out)
    return model


def _to_block_fp8(src, dst):
    """Rewrite a saved checkpoint as block-FP8 (DeepSeek's format); returns the directory of its dequantised
    twin, which transformers then runs on."""
    from asap.model.quant import quantize
    deq = dst.parent / (dst.name + "-dequantised")
    for d in (dst, deq):
        d.mkdir()
    hf = json.loads((src / "config.json").read_text())
    for f in src.glob("*.safetensors"):
        q_out, d_out = {}, {}
        for name, t in load_file(f).items():
            if t.dim() == 2 and not any(s in name for s in _NOT_QUANTISED):
                q, scale = quantize(t, tuple(BLOCK))
                q_out[name], q_out[name + "_scale_inv"] = q, scale
                full = scale.repeat_interleave(BLOCK[0], 0)[:t.shape[0]].repeat_interleave(BLOCK[1], 1)[:, :t.shape[1]]
                d_out[name] = q.float() * full
            else:
                q_out[name] = d_out[name] = t
        save_file(q_out, str(dst / f.name), metadata={"format": "pt"})
        save_file(d_out, str(deq / f.name), metadata={"format": "pt"})
    for extra in src.glob("*.json"):
        if extra.name != "config.json":
            for d in (dst, deq):
                (d / extra.name).write_text(extra.read_text())
    (deq / "config.json").write_text(json.dumps(hf))
    (dst / "config.json").write_text(json.dumps(dict(hf, quantization_config={
        "quant_method": "fp8", "fmt": "e4m3", "weight_block_size": BLOCK, "activation_scheme": "dynamic"})))
    assert any(t.dtype == torch.float8_e4m3fn for f in dst.glob("*.safetensors") for t in load_file(f).values())
    return deq


def _prompts(vocab: int, seed: int = 1):
    g = torch.Generator().manual_seed(seed)
    return [torch.randint(0, vocab, (n,), generator=g).tolist() for n in LENGTHS]


def _check_against_hf(hf, outs, prompts, mla: bool):
    for p, out in zip(prompts, outs):
        with torch.no_grad():
            r = hf(torch.tensor([p]), use_cache=True)
        ref = r.logits[0, -1].float()
        assert (out.logits - ref).abs().max().item() < 1e-4, len(p)
        assert out.first_token == int(ref.argmax())
        for layer in range(hf.config.num_hidden_layers):
            lay = r.past_key_values.layers[layer]
            k, v = lay.keys[0], lay.values[0]
            if mla:
                ours_k, ours_v, k, v = out.kv[layer]["kv_latent"], out.kv[layer]["k_rope"], k[0], v[0]
            else:
                ours_k, ours_v = out.kv[layer]["k"].transpose(0, 1), out.kv[layer]["v"].transpose(0, 1)
            assert torch.allclose(ours_k, k, atol=1e-5) and torch.allclose(ours_v, v, atol=1e-5), (len(p), layer)


CASES = {   # name: (preset, config changes, block-FP8)
    "deepseek-v3-yarn": ("tiny-deepseek-v3", dict(rope_scaling=DSV3_YARN, max_position_embeddings=163840), False),
    "deepseek-v3-yarn-fp8": ("tiny-deepseek-v3", dict(rope_scaling=DSV3_YARN, max_position_embeddings=163840), True),
    "qwen3-moe-fp8": ("tiny-qwen3-moe", {}, True),
    "qwen3-moe-yarn": ("tiny-qwen3-moe", dict(rope_scaling=QWEN_YARN), False),
    "glm4-moe": ("tiny-glm4-moe", {}, False),
    # fields that change the math: attention biases, no q LoRA, no q/k norm (GLM-4.5-Air)
    "deepseek-v3-bias-no-q-lora": ("tiny-deepseek-v3", dict(attention_bias=True, q_lora_rank=None), False),
    "qwen3-moe-bias-tied": ("tiny-qwen3-moe", dict(attention_bias=True, tie_word_embeddings=True), False),
    "glm4-moe-no-qk-norm": ("tiny-glm4-moe", dict(use_qk_norm=False, partial_rotary_factor=0.25), False),
}


@pytest.fixture(scope="module")
def checkpoints(tmp_path_factory):
    """name -> (model dir ASAP loads, transformers model on the same (dequantised) weights)."""
    made = {}
    for name, (preset, changes, fp8) in CASES.items():
        base = tmp_path_factory.mktemp(name)
        hf = _hf_model(preset, base / "hf", **changes)
        if fp8:
            deq = _to_block_fp8(base / "hf", base / "fp8")
            hf = getattr(transformers, f"{_CLASSES[hf.config.model_type]}ForCausalLM").from_pretrained(
                str(deq), dtype=torch.float32).eval()
            made[name] = (base / "fp8", hf)
        else:
            made[name] = (base / "hf", hf)
    return made


@pytest.mark.timeout(300)
@pytest.mark.parametrize("name", CASES)
def test_reference_engine_matches_transformers(name, checkpoints):
    path, hf = checkpoints[name]
    prompts = _prompts(hf.config.vocab_size)
    with asap.LLM(str(path), engine="reference") as llm:
        outs = llm.prefill(prompts)
    _check_against_hf(hf, outs, prompts, mla=name.startswith("deepseek"))


def test_yarn_is_not_a_no_op_on_these_weights(checkpoints):
    """The check above could not pass by accident: without YaRN the same weights give other logits."""
    path, hf = checkpoints["deepseek-v3-yarn"]
    plain = path.parent / "no-yarn"
    plain.mkdir()
    for f in path.iterdir():
        (plain / f.name).write_bytes(f.read_bytes())
    hf_cfg = json.loads((path / "config.json").read_text())
    hf_cfg.pop("rope_scaling", None)
    hf_cfg["rope_parameters"] = {"rope_type": "default", "rope_theta": 10000.0}
    (plain / "config.json").write_text(json.dumps(hf_cfg))
    p = _prompts(hf.config.vocab_size)[2]
    with asap.LLM(str(path)) as a, asap.LLM(str(plain)) as b:
        ya, no = a.prefill([p])[0].logits, b.prefill([p])[0].logits
    assert (ya - no).abs().max().item() > 1e-2


def test_a_block_fp8_slice_reads_only_its_tensors_and_their_scales(checkpoints, monkeypatch):
    import asap.model.loader as loader
    path, _ = checkpoints["deepseek-v3-yarn-fp8"]
    read = []

    class Recording:
        def __init__(self, f, framework):
            self.fh = _open(f, framework)

        def __enter__(self):
            self.inner = self.fh.__enter__()
            return self

        def __exit__(self, *exc):
            return self.fh.__exit__(*exc)

        def keys(self):
            return self.inner.keys()

        def get_tensor(self, name):
            read.append(name)
            return self.inner.get_tensor(name)

    _open = loader.safe_open
    monkeypatch.setattr(loader, "safe_open", Recording)
    shard = loader.load_expert_shard(path, [3, 1])
    assert shard.gate_up[1].dtype == torch.float8_e4m3fn          # experts stay FP8 in memory,
    assert shard.weights(1)[0].dtype == torch.float32              # and run in the runtime dtype
    assert read and all(".mlp.experts.1." in n or ".mlp.experts.3." in n for n in read)
    assert any(n.endswith("_scale_inv") for n in read)
    read.clear()
    loader.load_attention_side(path)
    assert read and not any(".mlp.experts." in n for n in read)
    assert any(n.endswith("q_b_proj.weight_scale_inv") for n in read)


ENGINE_CASES = [("deepseek-v3-yarn-fp8", "async"), ("deepseek-v3-yarn-fp8", "sync"), ("qwen3-moe-yarn", "async"),
                ("qwen3-moe-fp8", "sync"), ("glm4-moe", "async"), ("glm4-moe", "sync")]


@pytest.mark.timeout(300)
@pytest.mark.parametrize("name,engine", ENGINE_CASES, ids=[f"{n}-{e}" for n, e in ENGINE_CASES])
def test_async_and_sync_engines_match_transformers(name, engine, checkpoints):
    path, hf = checkpoints[name]
    prompts = _prompts(hf.config.vocab_size, seed=2)
    layout = dict(attention_workers=1, expert_workers=1) if engine == "async" else dict(devices=2)
    with asap.LLM(str(path), engine=engine, token_budget=512, **layout) as llm:     # chunks the 1500-token prompt
        outs = [f.result(timeout=240) for f in [llm.submit(p) for p in prompts]]
    _check_against_hf(hf, outs, prompts, mla=name.startswith("deepseek"))
