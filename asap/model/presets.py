"""Model presets: HF `config.json` dicts, declared by each family (asap.model.families).

`tiny-*` presets are for tests, `small-*` for CPU benchmarks (a few hundred
million parameters); the full-size ones carry the published config.json values
(../shared/REFERENCE.md) and are used by the simulator and cost model only.
Weights are never downloaded: `materialize` writes seeded random weights as a
real HF-format directory, so every code path goes through the same loader.
"""
from __future__ import annotations

from asap.model.families import FAMILIES

PRESETS: dict[str, dict] = {name: hf for fam in FAMILIES.values() for name, hf in fam.presets.items()}
CONFIG_ONLY = {name for fam in FAMILIES.values() for name in fam.config_only}


def preset_config(name: str) -> dict:
    if name not in PRESETS:
        raise ValueError(f"unknown preset {name!r}; available: {', '.join(PRESETS)}")
    return dict(PRESETS[name])
