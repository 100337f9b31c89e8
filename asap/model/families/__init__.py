"""The model registry: one module per family, looked up by config.json's `model_type`."""
from __future__ import annotations

from asap.model.errors import ModelLoadError
from asap.model.families.base import AttentionCost, Family
from asap.model.families.deepseek_v3 import DeepseekV3
from asap.model.families.glm4_moe import Glm4Moe
from asap.model.families.qwen3_moe import Qwen3Moe

FAMILIES: dict[str, Family] = {f.model_type: f for f in (DeepseekV3(), Glm4Moe(), Qwen3Moe())}


def get_family(model_type, source="config.json") -> Family:
    if model_type not in FAMILIES:
        raise ModelLoadError(source, f"field 'model_type': unsupported model_type {model_type!r}; "
                                     f"supported: {', '.join(FAMILIES)}")
    return FAMILIES[model_type]


__all__ = ["AttentionCost", "FAMILIES", "Family", "get_family"]
