"""A broken model directory is one line naming the file and the field or tensor, raised as ModelLoadError by the
reference engine and by the asap.model loading functions alike (issue 15, point 7; issue 12, point 5)."""
import json
import shutil

import pytest
import torch
from safetensors.torch import load_file, save_file

import asap
from asap.model.errors import ModelLoadError
from asap.model.loader import load_attention_side, load_expert_shard
from asap.model.tokenizer import load_tokenizer

SHARD = "model-00001.safetensors"


def _config(d, **changes):
    hf = json.loads((d / "config.json").read_text())
    hf.update(changes)
    (d / "config.json").write_text(json.dumps(hf))


def _drop(d, key):
    hf = json.loads((d / "config.json").read_text())
    del hf[key]
    (d / "config.json").write_text(json.dumps(hf))


def _tensors(d, edit):
    t = load_file(d / SHARD)
    edit(t)
    save_file(t, str(d / SHARD), metadata={"format": "pt"})
    index = json.loads((d / "model.safetensors.index.json").read_text())
    index["weight_map"] = {k: SHARD for k in t}
    (d / "model.safetensors.index.json").write_text(json.dumps(index))


def _set(name, value):
    return lambda t: t.__setitem__(name, value(t[name]) if callable(value) else value)


def _index(d, weight_map_edit):
    p = d / "model.safetensors.index.json"
    index = json.loads(p.read_text())
    weight_map_edit(index)
    p.write_text(json.dumps(index))


A = "model.layers.1.self_attn."
# name: (how to break the tiny-qwen3-moe directory, what the one-line error must say)
BROKEN = {
    "no-config": (lambda d: (d / "config.json").unlink(), r"no config.json"),
    "config-bad-json": (lambda d: (d / "config.json").write_text('{"model_type": "qwen3_moe",'),
                        r"config.json: invalid JSON"),
    "config-not-object": (lambda d: (d / "config.json").write_text("[1, 2]"), r"config.json: expected a JSON object"),
    "config-not-utf8": (lambda d: (d / "config.json").write_bytes(b'{"a": "\xff\xfe"}'), r"config.json: not UTF-8"),
    "hidden-size-string": (lambda d: _config(d, hidden_size="64"), r"config.json: field 'hidden_size' must be an integer"),
    "layers-float": (lambda d: _config(d, num_hidden_layers=3.0), r"field 'num_hidden_layers' must be an integer"),
    "heads-bool": (lambda d: _config(d, num_attention_heads=True), r"field 'num_attention_heads' must be an integer"),
    "missing-field": (lambda d: _drop(d, "moe_intermediate_size"), r"field 'moe_intermediate_size' is missing"),
    "missing-model-type": (lambda d: _drop(d, "model_type"), r"field 'model_type' is missing"),
    "unknown-model-type": (lambda d: _config(d, model_type="llama"), r"unsupported model_type 'llama'"),
    "zero-vocab": (lambda d: _config(d, vocab_size=0), r"field 'vocab_size' must be >= 1"),
    "heads-not-multiple": (lambda d: _config(d, num_key_value_heads=3), r"config.json: num_attention_heads=4 must be"),
    "top-k-too-large": (lambda d: _config(d, num_experts_per_tok=17), r"num_experts_per_tok=17"),
    "quant-awq": (lambda d: _config(d, quantization_config={"quant_method": "awq"}), r"quant_method 'awq'"),
    "rope-dynamic": (lambda d: _config(d, rope_parameters={"rope_type": "dynamic", "factor": 2.0, "rope_theta": 1e6}),
                     r"rope_type 'dynamic' is not supported"),
    "dtype-int8": (lambda d: _config(d, dtype="int8"), r"field 'torch_dtype'"),
    "index-bad-json": (lambda d: (d / "model.safetensors.index.json").write_text("{"),
                       r"model.safetensors.index.json: invalid JSON"),
    "index-no-weight-map": (lambda d: (d / "model.safetensors.index.json").write_text("{}"),
                            r"model.safetensors.index.json: field 'weight_map'"),
    "missing-shard": (lambda d: _index(d, lambda i: i["weight_map"].__setitem__("lm_head.weight", "model-00002.safetensors")),
                      r"model-00002.safetensors: shard is missing"),
    "truncated-shard": (lambda d: (d / SHARD).write_bytes((d / SHARD).read_bytes()[:5000]),
                        rf"{SHARD}: not a readable safetensors file"),
    "garbage-shard": (lambda d: (d / SHARD).write_bytes(b"\x00" * 64), rf"{SHARD}: not a readable safetensors file"),
    "no-weights": (lambda d: [(d / SHARD).unlink(), (d / "model.safetensors.index.json").unlink()],
                   r"no \*.safetensors weights"),
    "missing-tensor": (lambda d: _tensors(d, lambda t: t.pop(A + "o_proj.weight")), rf"tensor '{A}o_proj.weight'.* missing"),
    "vocab-larger-than-embedding": (lambda d: _config(d, vocab_size=600),
                                    r"tensor 'model.embed_tokens.weight' has shape \(512, 64\), the config expects \(600, 64\)"),
    "wrong-shape": (lambda d: _tensors(d, _set(A + "q_proj.weight", lambda w: w[:32])),
                    rf"{SHARD}: tensor '{A}q_proj.weight' has shape \(32, 64\)"),
    "nan-weights": (lambda d: _tensors(d, _set("model.norm.weight", lambda w: w * float("nan"))),
                    rf"{SHARD}: tensor 'model.norm.weight' has non-finite values"),
    "inf-expert": (lambda d: _tensors(d, _set("model.layers.2.mlp.experts.3.down_proj.weight", lambda w: w / 0)),
                   r"tensor 'model.layers.2.mlp.experts.3.down_proj.weight' has non-finite values"),
    "unexpected-bias": (lambda d: _tensors(d, _set(A + "q_proj.bias", torch.zeros(64))),
                        rf"unexpected tensor '{A}q_proj.bias'"),
    "fp8-without-quant-config": (lambda d: _tensors(d, _set(A + "k_proj.weight", lambda w: w.to(torch.float8_e4m3fn))),
                                 r"is torch.float8_e4m3fn but config.json has no quantization_config"),
    "fp8-without-scale": (lambda d: [_config(d, quantization_config={"quant_method": "fp8", "weight_block_size": [16, 16]}),
                                     _tensors(d, _set(A + "k_proj.weight", lambda w: w.to(torch.float8_e4m3fn)))],
                          rf"'{A}k_proj.weight_scale_inv' is missing"),
    "fp8-scale-shape": (lambda d: [_config(d, quantization_config={"quant_method": "fp8", "weight_block_size": [16, 16]}),
                                   _tensors(d, lambda t: [_set(A + "k_proj.weight", lambda w: w.to(torch.float8_e4m3fn))(t),
                                                          t.__setitem__(A + "k_proj.weight_scale_inv", torch.ones(3, 3))])],
                        rf"tensor '{A}k_proj.weight_scale_inv' has shape \(3, 3\), expected \(2, 4\)"),
    "integer-tensor": (lambda d: _tensors(d, _set("model.norm.weight", lambda w: w.to(torch.int32))),
                       r"tensor 'model.norm.weight' has dtype torch.int32"),
}


@pytest.fixture
def broken(tiny_dirs, tmp_path, request):
    d = tmp_path / "model"
    shutil.copytree(tiny_dirs["tiny-qwen3-moe"], d)
    assert [p.name for p in d.glob("*.safetensors")] == [SHARD]
    BROKEN[request.param][0](d)
    return d, BROKEN[request.param][1]


def _one_line(e: ModelLoadError, d):
    msg = str(e)
    assert "\n" not in msg and len(msg) < 400 and str(d) in msg
    return msg


@pytest.mark.parametrize("broken", list(BROKEN), indirect=True)
def test_reference_engine_says_what_is_broken_in_one_line(broken):
    d, expect = broken
    with pytest.raises(ModelLoadError, match=expect) as e:
        asap.LLM(str(d), engine="reference")
    _one_line(e.value, d)


_ATTN, _EXPERTS = load_attention_side, (lambda p: load_expert_shard(p, list(range(16))))
# A slice reads only its own tensors, so a damaged expert is found by the expert worker that loads it.
SLICES = [("hidden-size-string", _ATTN), ("hidden-size-string", _EXPERTS), ("missing-shard", _ATTN),
          ("missing-shard", _EXPERTS), ("truncated-shard", _EXPERTS), ("wrong-shape", _ATTN),
          ("inf-expert", _EXPERTS), ("fp8-scale-shape", _ATTN), ("unexpected-bias", _EXPERTS)]


@pytest.mark.parametrize("broken,load", SLICES, indirect=["broken"],
                         ids=[f"{n}-{'attention' if f is _ATTN else 'experts'}" for n, f in SLICES])
def test_loading_functions_raise_the_same_error(broken, load):
    d, expect = broken
    with pytest.raises(ModelLoadError, match=expect) as e:
        load(d)
    _one_line(e.value, d)


def test_mtp_layers_are_never_read(tiny_dirs, tmp_path, monkeypatch):
    """Tensors of layers past num_hidden_layers (DeepSeek's MTP layer) are accepted and never read."""
    from asap.model.loader import Checkpoint
    d = tmp_path / "model"
    shutil.copytree(tiny_dirs["tiny-deepseek-v3"], d)
    mtp = "model.layers.3.self_attn.kv_a_proj_with_mqa.weight"
    _tensors(d, _set(mtp, torch.full((40, 64), float("nan"))))
    read = []
    orig = Checkpoint.iter
    monkeypatch.setattr(Checkpoint, "iter", lambda self, names, *a: (read.extend(names), orig(self, names, *a))[1])
    with asap.LLM(str(d)) as llm:
        assert llm.prefill([[1, 2, 3]])[0].logits.isfinite().all()
    assert read and not any(n.startswith("model.layers.3.") for n in read)


@pytest.mark.parametrize("content,expect", [("{bad", "tokenizer.json: not a valid tokenizers file"),
                                            ("", "tokenizer.json: not a valid tokenizers file")])
def test_corrupt_tokenizer_names_the_file(tiny_dirs, tmp_path, content, expect):
    d = tmp_path / "model"
    shutil.copytree(tiny_dirs["tiny-qwen3-moe"], d)
    (d / "tokenizer.json").write_text(content)
    with pytest.raises(ModelLoadError, match=expect) as e:
        load_tokenizer(d)
    _one_line(e.value, d)


@pytest.mark.parametrize("broken", ["hidden-size-string", "missing-field", "quant-awq"], indirect=True)
@pytest.mark.parametrize("engine", ["async", "sync"])
def test_every_engine_refuses_a_broken_config_the_same_way(broken, engine):
    d, expect = broken
    with pytest.raises(ModelLoadError, match=expect) as e:
        asap.LLM(str(d), engine=engine)
    _one_line(e.value, d)
