"""The KV hand-off is usable by a decode engine: prefill with `asap serve` (async engine), pull the cache
named by vLLM-style kv_transfer_params, feed it to transformers as past_key_values, and the next
token's logits equal transformers' own full forward. Requests that do not ask keep nothing."""
import httpx
import pytest
import torch

import asap.kv
from asap.model.presets import preset_config
from asap.server.process import ServerProcess

transformers = pytest.importorskip("transformers")
pytestmark = pytest.mark.timeout(300)
PROMPT = [7, 300, 12, 45, 99, 3, 250, 18, 64, 101, 5, 77, 410]


def _hf_model(preset: str, path):
    cfg = preset_config(preset)
    cls = {"deepseek_v3": (transformers.DeepseekV3Config, transformers.DeepseekV3ForCausalLM),
           "qwen3_moe": (transformers.Qwen3MoeConfig, transformers.Qwen3MoeForCausalLM)}[cfg["model_type"]]
    torch.manual_seed(0)
    model = cls[1](cls[0](**{k: v for k, v in cfg.items() if k not in ("model_type", "architectures")})).eval()
    with torch.no_grad():                       # norms away from 1 so that they are exercised
        for name, p in model.named_parameters():
            if "norm" in name:
                p.add_(0.1 * torch.randn_like(p))
    model.save_pretrained(path)
    return model


@pytest.mark.parametrize("preset", ["tiny-deepseek-v3", "tiny-qwen3-moe"])
def test_pulled_kv_continues_in_transformers_exactly(preset, tmp_path):
    hf = _hf_model(preset, tmp_path / "model")
    args = [str(tmp_path / "model"), "--engine", "async", "--attention-workers", "1", "--expert-workers", "1"]
    with ServerProcess(args, tmp_path / "server.log") as srv, httpx.Client(base_url=srv.url, timeout=120) as client:
        plain = client.post("/v1/completions", json={"prompt": PROMPT, "max_tokens": 1})
        assert plain.status_code == 200 and plain.json()["kv_transfer_params"] is None
        assert "asap:kv_store_entries{" in (m := client.get("/metrics").text) and \
            [line for line in m.splitlines() if line.startswith("asap:kv_store_entries{")][0].endswith(" 0.0")
        r = client.post("/v1/completions", json={"prompt": PROMPT, "max_tokens": 1, "temperature": 0,
                                                 "kv_transfer_params": {"do_remote_decode": True}})
        assert r.status_code == 200, r.text
        params, [choice] = r.json()["kv_transfer_params"], r.json()["choices"]
        assert params["do_remote_prefill"] is True and params["remote_host"] == "127.0.0.1"
        assert params["remote_port"] == int(srv.url.rsplit(":", 1)[1]) and params["num_tokens"] == len(PROMPT)
        kv = asap.kv.pull(params)
        with pytest.raises(RuntimeError, match="404"):          # served once
            asap.kv.pull(params)
    assert kv.num_tokens == len(PROMPT) and kv.layout == ("mla" if "deepseek" in preset else "gqa")
    [nxt] = choice["token_ids"]
    with torch.no_grad():
        full = hf(torch.tensor([PROMPT + [nxt]])).logits[0, -1]
        assert int(hf(torch.tensor([PROMPT])).logits[0, -1].argmax()) == nxt      # greedy first token
        cache = asap.kv.to_transformers_cache(kv, hf.config)
        continued = hf(torch.tensor([[nxt]]), cache=cache, use_cache=True).logits[0, -1]
    diff = (continued - full).abs().max().item()
    print(f"{preset}: pulled KV -> transformers, next-token logits max |diff| {diff:.2e} vs its full forward")
    assert diff < 1e-4
