"""How a headline row hands its configurations to the next, larger device count (asap.studies.headline):
which of an engine's tuned candidates it carries (`ranked`, `carry`), and each one on more devices, scaled
as one instance (`scale_config`) or replicated as independent instances (`replicate`), the same for both
engines."""
from __future__ import annotations

import dataclasses

from asap.cost.hardware import get_hardware
from asap.sim.memory import check_memory, min_expert_workers
from asap.sim.run import get_model
from asap.studies.config import EngineConfig
from asap.studies.tune import REFINE


def replicate(c: EngineConfig, devices: int, from_devices: int) -> EngineConfig | None:
    """The configuration found at `from_devices` as devices / from_devices independent copies of it."""
    if devices % from_devices:
        return None
    return dataclasses.replace(c, instances=c.instances * devices // from_devices)


def scale_config(c: EngineConfig, devices: int, from_devices: int, model, hardware) -> EngineConfig | None:
    """A configuration found at `from_devices`, on `devices` devices (None where it does not fit). A fleet's wide
    group and a short-prompt lane keep their shares of the devices."""
    if c.instances > 1 and c.engine == "async":
        return replicate(c, devices, from_devices)

    def share(n: int, per: int) -> int:         # n of `per` devices' replicas, on `devices` (0 stays 0)
        return n and max(1, round(n * devices / per))
    per = from_devices // c.instances
    if c.engine == "sync" or c.colocated:   # one instance over all the devices, the same DP group / replica
        try:                                # shape (replicate keeps the instance size)
            check_memory("sync", get_model(model), get_hardware(hardware), devices, devices, c.attention_tp)
        except ValueError:
            return None
        if devices % c.attention_tp:
            return None
        if c.wide_replicas:
            return dataclasses.replace(c, instances=1, wide_replicas=share(c.wide_replicas, per),
                                       short_replicas=share(c.short_replicas, per))
        return dataclasses.replace(c, instances=1, attention_workers=devices // c.attention_tp if c.colocated
                                   else c.attention_workers, short_replicas=share(c.short_replicas, per))
    e_min = min_expert_workers(get_model(model), get_hardware(hardware))
    a = max(1, round(c.attention_workers * devices / from_devices))
    a = min(a, (devices - e_min) // c.attention_tp)
    return dataclasses.replace(c, attention_workers=a, short_replicas=min(share(c.short_replicas, per), a - 1)) \
        if a >= 1 else None


def ranked(candidates: list[dict]) -> list[dict]:
    """A tune's table rows that found a rate, best first: candidates whose maximum tune confirmed (--sustained)
    by that maximum, then those only fine-searched by the fine rate, then those only coarse-searched by the
    coarse rate, then failed confirmations. Tiers, not one scale: a coarse or unconfirmed rate is looser than
    a confirmed one, and ranking them together let an unconfirmed runner-up displace the tune's best as the
    configuration a larger row starts from."""
    def key(c):
        if "sustained_rate" in c:
            return (0, -c["sustained_rate"]) if c["sustained_rate"] else (3, -(c["fine_rate"] or c["coarse_rate"]))
        return (1, -c["fine_rate"]) if c["fine_rate"] else (2, -c["coarse_rate"])
    return sorted((c for c in candidates if c["fine_rate"] or c["coarse_rate"]), key=key)


def carry(engine_row: dict, first: bool) -> list[EngineConfig]:
    """The configurations one engine's row hands the next device count (scaled and replicated there): its best
    REFINE by the headline's criterion from a row's first device count, its best one from later ones
    (`ranked`), and its best by the every-length-bucket criterion, which the next row's every-bucket tune would
    otherwise never see (the 32-die conversation row's sync DP4 x TP4 + DP1 x TP16 at 4K, never tried at 64)."""
    picked = [c["config"] for c in ranked(engine_row["candidates"])[:REFINE if first else 1]]
    eb = (engine_row.get("every_bucket") or {}).get("config")
    return list(dict.fromkeys(EngineConfig(**c) for c in picked + ([eb] if eb else [])))
