"""Promises of the KV hand-off store and the admission bound (pure CPU, no server)."""
import pytest
import torch
from safetensors.torch import load

from asap.server.admission import Admission
from asap.server.kv_store import KVStore, encode, kv_tensors, stream_chunks, stream_size


class Clock:
    def __init__(self):
        self.t = 0.0

    def __call__(self):
        return self.t


def cache(nbytes: int) -> dict:
    return {"layers.0.kv_latent": torch.zeros(nbytes // 4)}


def test_claim_streams_safetensors_once_and_counts_it_until_released():
    kv = [{"kv_latent": torch.randn(5, 4), "k_rope": torch.randn(5, 2)}, {"kv_latent": torch.randn(5, 4),
                                                                            "k_rope": torch.randn(5, 2)}]
    store = KVStore(1 << 20, ttl_s=10)
    handle = store.put(kv_tensors(kv), {"num_tokens": "5"})
    entry = store.take(handle)
    pieces = list(stream_chunks(entry, chunk_bytes=16))     # many pieces: none holds the whole file
    data = b"".join(pieces)
    assert len(data) == stream_size(entry) and max(map(len, pieces[1:])) <= 16
    tensors = load(data)
    assert sorted(tensors) == ["layers.0.k_rope", "layers.0.kv_latent", "layers.1.k_rope", "layers.1.kv_latent"]
    assert torch.equal(tensors["layers.1.kv_latent"], kv[1]["kv_latent"])
    assert load(encode(entry)).keys() == tensors.keys()      # the same file safetensors writes, tensor for tensor
    assert store.take(handle) is None and store.num_bytes == 240     # claimed, still counted while being read
    store.release(handle)
    assert store.num_bytes == 0


def test_streamed_bfloat16_cache_loads_bit_for_bit():
    t = torch.randn(7, 3).to(torch.bfloat16)
    store = KVStore(1 << 20, ttl_s=10)
    entry = store.take(store.put({"layers.0.k": t}, {}))
    assert torch.equal(load(b"".join(stream_chunks(entry, 8)))["layers.0.k"], t)


def test_a_cache_being_read_is_never_evicted_and_new_ones_must_fit_beside_it():
    store = KVStore(1000, ttl_s=60)
    reading = store.put(cache(600), {})
    store.take(reading)
    assert store.put(cache(600), {}) is None           # 600 + 600 > 1000 even with nothing unclaimed left
    small = store.put(cache(400), {})
    assert small is not None and store.num_bytes == 1000
    store.release(reading)
    assert store.put(cache(700), {}) is not None and store.take(small) is None    # the oldest unclaimed went


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
