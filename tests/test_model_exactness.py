"""The model matches Hugging Face transformers on the same weights (issue: foundation, point 6)."""
import pytest
import torch

transformers = pytest.importorskip("transformers")

import asap  # noqa: E402
from asap.model.presets import preset_config  # noqa: E402

LENGTHS = [1, 7, 64, 200, 512, 33]


def _hf_model(preset: str, tmp_path):
    cfg = preset_config(preset)
    cls = {"deepseek_v3": (transformers.DeepseekV3Config, transformers.DeepseekV3ForCausalLM),
           "qwen3_moe": (transformers.Qwen3MoeConfig, transformers.Qwen3MoeForCausalLM)}[cfg["model_type"]]
    torch.manual_seed(0)
    model = cls[1](cls[0](**{k: v for k, v in cfg.items() if k not in ("model_type", "architectures")})).eval()
    with torch.no_grad():   # HF initialises norms to 1 and the correction bias to 0: perturb so they are tested
        for name, p in model.named_parameters():
            if "norm" in name:
                p.add_(0.1 * torch.randn_like(p))
        for name, b in model.named_buffers():
            if "e_score_correction_bias" in name:
                b.copy_(0.05 * torch.randn_like(b))
    model.save_pretrained(tmp_path)
    return model


def _hf_kv(cache, layer):
    lay = cache.layers[layer]
    return lay.keys[0], lay.values[0]          # [heads(or 1), L, dim]


@pytest.mark.parametrize("preset", ["tiny-deepseek-v3", "tiny-qwen3-moe"])
def test_matches_transformers(preset, tmp_path):
    hf = _hf_model(preset, tmp_path)
    g = torch.Generator().manual_seed(1)
    vocab = hf.config.vocab_size
    prompts = [torch.randint(0, vocab, (n,), generator=g).tolist() for n in LENGTHS]
    with asap.LLM(str(tmp_path), engine="reference") as llm:
        outs = llm.prefill(prompts)
    for p, out in zip(prompts, outs):
        with torch.no_grad():
            r = hf(torch.tensor([p]), use_cache=True)
        ref = r.logits[0, -1].float()
        assert out.logits.dtype == torch.float32 and out.logits.shape == (vocab,)
        assert (out.logits - ref).abs().max().item() < 1e-4
        assert out.first_token == int(ref.argmax())
        for layer in range(hf.config.num_hidden_layers):
            k, v = _hf_kv(r.past_key_values, layer)
            if preset.startswith("tiny-deepseek"):
                ours_k, ours_v = out.kv[layer]["kv_latent"], out.kv[layer]["k_rope"]
                k, v = k[0], v[0]
            else:
                ours_k, ours_v = out.kv[layer]["k"].transpose(0, 1), out.kv[layer]["v"].transpose(0, 1)
            assert torch.allclose(ours_k, k, atol=1e-5) and torch.allclose(ours_v, v, atol=1e-5)
