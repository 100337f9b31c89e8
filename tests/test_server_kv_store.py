"""Promises of the KV hand-off store and the admission bound (pure CPU, no server)."""
import pytest
import torch
from safetensors.torch import load

from asap.server.admission import Admission
from asap.server.kv_store import KVStore, encode, kv_tensors


class Clock:
    def __init__(self):
        self.t = 0.0

    def __call__(self):
        return self.t


def cache(nbytes: int) -> dict:
    return {"layers.0.kv_latent": torch.zeros(nbytes // 4)}


def test_claim_returns_safetensors_once():
    kv = [{"kv_latent": torch.randn(5, 4), "k_rope": torch.randn(5, 2)}, {"kv_latent": torch.randn(5, 4),
                                                                            "k_rope": torch.randn(5, 2)}]
    store = KVStore(1 << 20, ttl_s=10)
    handle = store.put(kv_tensors(kv), {"num_tokens": "5"})
    tensors = load(encode(store.take(handle)))
    assert sorted(tensors) == ["layers.0.k_rope", "layers.0.kv_latent", "layers.1.k_rope", "layers.1.kv_latent"]
    assert torch.equal(tensors["layers.1.kv_latent"], kv[1]["kv_latent"])
    assert store.take(handle) is None and store.num_bytes == 0


def test_views_are_copied_so_their_bytes_are_counted():
    base = torch.zeros(1000, 4)
    tensors = kv_tensors([{"k": base[:10]}])
    assert tensors["layers.0.k"].untyped_storage().nbytes() == 10 * 4 * 4


def test_unclaimed_caches_expire_after_the_ttl():
    clock = Clock()
    store = KVStore(1 << 20, ttl_s=5, clock=clock)
    old = store.put(cache(400), {})
    clock.t = 3
    new = store.put(cache(400), {})
    clock.t = 5
    store.sweep()
    assert store.take(old) is None and len(store) == 1 and store.num_evicted["ttl"] == 1
    assert store.take(new) is not None


def test_memory_bound_evicts_the_oldest_and_never_refuses():
    store = KVStore(1000, ttl_s=60)
    handles = [store.put(cache(400), {}) for _ in range(3)]
    assert store.num_bytes == 800 and store.num_evicted["memory"] == 1
    assert store.take(handles[0]) is None and store.take(handles[2]) is not None
    assert store.put(cache(2000), {}) is None            # one cache over the whole bound is not kept


def test_admission_is_bounded_and_released_by_futures():
    adm = Admission(2)
    assert adm.try_admit() and adm.try_admit() and not adm.try_admit()
    adm.release(object())                                # as a Future done-callback
    assert adm.try_admit() and adm.num_pending == 2
    with pytest.raises(ValueError):
        Admission(0)
