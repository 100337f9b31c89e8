"""The official config.json files parse, every field is honoured or refused, and the parameter counts are the
published ones (issue 12, points 2-4)."""
import json
import math
from pathlib import Path

import pytest
import torch

from asap.config import ModelConfig
from asap.model.errors import ModelLoadError

CONFIGS = Path(__file__).parent / "data" / "configs"
# name: (total B, activated B, whether the vendor's activated count includes the embedding and LM head matrices)
PUBLISHED = {
    "DeepSeek-V3": (671, 37, True), "DeepSeek-R1": (671, 37, True),
    "Qwen3-235B-A22B": (235, 22, True), "Qwen3-30B-A3B": (30.5, 3.3, True),
    "GLM-4.5": (355, 32, False), "GLM-4.5-Air": (106, 12, False),
}


def _hf(name: str) -> dict:
    return json.loads((CONFIGS / f"{name}.json").read_text())


@pytest.mark.parametrize("name", PUBLISHED)
def test_official_configs_have_the_published_parameter_counts(name):
    cfg = ModelConfig.from_hf(_hf(name))
    total, active, with_embeddings = PUBLISHED[name]
    n = cfg.num_params()
    vd = cfg.vocab_size * cfg.hidden_size
    activated = n["active"] + vd if with_embeddings else n["active"] - vd
    assert n["total"] / 1e9 == pytest.approx(total, rel=0.015)
    assert activated / 1e9 == pytest.approx(active, rel=0.025)


@pytest.mark.parametrize("name", PUBLISHED)
def test_every_field_is_honoured_refused_or_inert(name):
    assert ModelConfig.unread_fields(_hf(name)) == []


def test_deepseek_v3_official_settings():
    cfg = ModelConfig.from_hf(_hf("DeepSeek-V3"))
    assert cfg.rope.rope_type == "yarn" and cfg.rope.get("factor") == 40 and cfg.rope.theta == 10000
    assert cfg.dtype == "bfloat16" and cfg.quant.block == (128, 128) and cfg.quant.fmt == "e4m3"
    assert cfg.num_mtp_layers == 1 and cfg.moe_layers[:4] == (False, False, False, True)
    mscale = 0.1 * math.log(40) + 1.0
    assert cfg.family.softmax_scale(cfg) == pytest.approx(192 ** -0.5 * mscale ** 2)
    assert cfg.rope.attention_factor(cfg.max_position_embeddings) == 1.0      # mscale / mscale_all_dim
    assert cfg.kv_cache_dims == {"kv_latent": (512,), "k_rope": (64,)}


def test_glm45_official_settings():
    cfg, air = ModelConfig.from_hf(_hf("GLM-4.5")), ModelConfig.from_hf(_hf("GLM-4.5-Air"))
    assert cfg.partial_rotary_factor == 0.5 and cfg.family.rotary_dim(cfg) == 64
    assert cfg.attention_bias and cfg.qk_norm and not air.qk_norm
    assert cfg.moe_layers[:4] == (False, False, False, True) and air.moe_layers[:2] == (False, True)
    assert cfg.scoring == "sigmoid" and cfg.n_shared_experts == 1 and cfg.num_mtp_layers == 1
    assert cfg.kv_cache_dims == {"k": (8, 128), "v": (8, 128)}


def _transformers_inv_freq(hf: dict, model_type: str):
    transformers = pytest.importorskip("transformers")
    from transformers.modeling_rope_utils import ROPE_INIT_FUNCTIONS
    cls = {"deepseek_v3": transformers.DeepseekV3Config, "qwen3_moe": transformers.Qwen3MoeConfig,
           "glm4_moe": transformers.Glm4MoeConfig}[model_type]
    c = cls(**{k: v for k, v in hf.items() if k not in ("model_type", "architectures", "auto_map")})
    rope_type = c.rope_parameters["rope_type"]
    if rope_type == "default":
        return None
    return ROPE_INIT_FUNCTIONS[rope_type](c)


ROPES = [
    ("deepseek_v3", {"type": "yarn", "factor": 40, "beta_fast": 32, "beta_slow": 1, "mscale": 1.0,
                     "mscale_all_dim": 1.0, "original_max_position_embeddings": 4096}),
    ("qwen3_moe", {"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 32768}),
    ("qwen3_moe", {"rope_type": "linear", "factor": 2.0}),
    ("qwen3_moe", {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
                   "original_max_position_embeddings": 8192}),
    ("glm4_moe", {"rope_type": "yarn", "factor": 2.0, "original_max_position_embeddings": 65536}),
]


@pytest.mark.parametrize("model_type,rope", ROPES, ids=[f"{m}-{r.get('type', r.get('rope_type'))}" for m, r in ROPES])
@pytest.mark.parametrize("spelling", ["rope_scaling", "rope_parameters"])
def test_rope_tables_equal_transformers(model_type, rope, spelling):
    base = {"deepseek_v3": "DeepSeek-V3", "qwen3_moe": "Qwen3-30B-A3B", "glm4_moe": "GLM-4.5-Air"}[model_type]
    hf = {k: v for k, v in _hf(base).items() if k not in ("rope_scaling", "quantization_config")}
    theta = hf.pop("rope_theta")
    hf = dict(hf, rope_scaling=rope, rope_theta=theta) if spelling == "rope_scaling" else \
        dict(hf, rope_parameters=dict(rope, rope_theta=theta))
    cfg = ModelConfig.from_hf(hf)
    dim = cfg.qk_rope_head_dim if model_type == "deepseek_v3" else cfg.family.rotary_dim(cfg)
    inv, factor = _transformers_inv_freq(hf, model_type)
    assert torch.allclose(cfg.rope.inv_freq(dim, cfg.max_position_embeddings), inv, rtol=1e-6, atol=0)
    assert cfg.rope.attention_factor(cfg.max_position_embeddings) == pytest.approx(factor)


@pytest.mark.parametrize("rope,name", [({"type": "dynamic", "factor": 2.0}, "dynamic"),
                                       ({"rope_type": "longrope", "short_factor": [1.0]}, "longrope"),
                                       ({"rope_type": "ntk-by-parts"}, "ntk-by-parts"),
                                       ({"rope_type": "linear"}, "needs 'factor'")])
def test_other_rope_types_are_refused_by_name(rope, name):
    with pytest.raises(ModelLoadError, match=name):
        ModelConfig.from_hf(dict(_hf("Qwen3-30B-A3B"), rope_scaling=rope))


@pytest.mark.parametrize("method", ["awq", "gptq", "compressed-tensors", "mxfp4", "bitsandbytes", None])
def test_other_quant_methods_are_refused_by_name(method):
    hf = dict(_hf("DeepSeek-V3"), quantization_config={"quant_method": method, "bits": 4})
    with pytest.raises(ModelLoadError, match=f"quant_method {method!r} is not supported"):
        ModelConfig.from_hf(hf)


@pytest.mark.parametrize("change,field", [
    ({"use_sliding_window": True}, "use_sliding_window"),
    ({"hidden_act": "gelu"}, "hidden_act"),
    ({"hidden_size": "2048"}, "hidden_size"),
    ({"num_hidden_layers": 4.0}, "num_hidden_layers"),
    ({"norm_topk_prob": "yes"}, "norm_topk_prob"),
    ({"mlp_only_layers": "0"}, "mlp_only_layers"),
    ({"torch_dtype": "int8"}, "torch_dtype"),
    ({"vocab_size": 0}, "vocab_size"),
    ({"rms_norm_eps": -1}, "rms_norm_eps"),
])
def test_unsupported_or_mistyped_fields_name_the_field(change, field):
    with pytest.raises(ModelLoadError, match=f"'{field}'"):
        ModelConfig.from_hf(dict(_hf("Qwen3-30B-A3B"), **change))


@pytest.mark.parametrize("change,field", [({"scoring_func": "softmax"}, "scoring_func"),
                                          ({"topk_method": "greedy"}, "topk_method"),
                                          ({"moe_layer_freq": 2}, "moe_layer_freq"),
                                          ({"kv_lora_rank": None}, "kv_lora_rank")])
def test_deepseek_fields_are_honoured_or_refused(change, field):
    with pytest.raises(ModelLoadError, match=f"'{field}'"):
        ModelConfig.from_hf(dict(_hf("DeepSeek-V3"), **change))


def test_torch_dtype_is_the_default_runtime_dtype():
    from asap.model.loader import runtime_dtype
    assert runtime_dtype(ModelConfig.from_hf(_hf("GLM-4.5")), None) == torch.bfloat16
    assert runtime_dtype(ModelConfig.from_hf(_hf("GLM-4.5")), "float32") == torch.float32
    assert runtime_dtype(ModelConfig.from_hf({k: v for k, v in _hf("GLM-4.5").items() if k != "torch_dtype"}),
                         None) == torch.float32


def test_an_unknown_field_is_named_in_a_warning(tmp_path):
    (tmp_path / "config.json").write_text(json.dumps(dict(_hf("GLM-4.5-Air"), sliding_window_pattern=4)))
    with pytest.warns(UserWarning, match="config.json: fields ASAP does not read .*sliding_window_pattern"):
        ModelConfig.from_dir(tmp_path)


def test_transformers_derived_head_dims_must_agree():
    assert ModelConfig.from_hf(dict(_hf("DeepSeek-V3"), head_dim=64, qk_head_dim=192)).qk_head_dim == 192
    with pytest.raises(ModelLoadError, match="field 'qk_head_dim' = 128 disagrees"):
        ModelConfig.from_hf(dict(_hf("DeepSeek-V3"), qk_head_dim=128))


# ours -> transformers' config attribute, for fields a config.json may leave out
_DEFAULTED = {"deepseek_v3": {"n_group": "n_group", "topk_group": "topk_group", "q_lora_rank": "q_lora_rank",
                              "routed_scaling_factor": "routed_scaling_factor", "n_shared_experts": "n_shared_experts",
                              "rope_interleave": "rope_interleave", "norm_topk_prob": "norm_topk_prob",
                              "rms_norm_eps": "rms_norm_eps", "max_position_embeddings": "max_position_embeddings"},
              "qwen3_moe": {"norm_topk_prob": "norm_topk_prob", "rms_norm_eps": "rms_norm_eps",
                            "max_position_embeddings": "max_position_embeddings", "attention_bias": "attention_bias"},
              "glm4_moe": {"n_group": "n_group", "topk_group": "topk_group", "qk_norm": "use_qk_norm",
                           "routed_scaling_factor": "routed_scaling_factor", "n_shared_experts": "n_shared_experts",
                           "norm_topk_prob": "norm_topk_prob", "rms_norm_eps": "rms_norm_eps",
                           "partial_rotary_factor": "partial_rotary_factor", "attention_bias": "attention_bias",
                           "max_position_embeddings": "max_position_embeddings"}}
_KEEP = ("model_type", "vocab_size", "hidden_size", "num_hidden_layers", "num_attention_heads", "num_key_value_heads",
         "intermediate_size", "moe_intermediate_size", "num_experts_per_tok", "n_routed_experts", "num_experts",
         "kv_lora_rank", "qk_nope_head_dim", "qk_rope_head_dim", "v_head_dim", "head_dim", "rope_theta")


@pytest.mark.parametrize("name", ["DeepSeek-V3", "Qwen3-30B-A3B", "GLM-4.5"])
def test_absent_fields_take_transformers_defaults(name):
    transformers = pytest.importorskip("transformers")
    hf = {k: v for k, v in _hf(name).items() if k in _KEEP}
    cfg = ModelConfig.from_hf(hf)
    cls = {"deepseek_v3": transformers.DeepseekV3Config, "qwen3_moe": transformers.Qwen3MoeConfig,
           "glm4_moe": transformers.Glm4MoeConfig}[hf["model_type"]]
    theirs = cls(**{k: v for k, v in hf.items() if k != "model_type"})
    for ours, attr in _DEFAULTED[hf["model_type"]].items():
        want = theirs.rope_parameters.get(attr) if attr == "partial_rotary_factor" else getattr(theirs, attr)
        assert getattr(cfg, ours) == want, ours
