"""The prefix cache (issue 13, point 7): LRU over 512-token block hashes, one per replica / DP group, its
capacity from the memory left after weights, the same policy in both simulated engines, and off = today."""
import dataclasses
import json
import math

import pytest

from asap.scheduler.prefix_cache import BLOCK_TOKENS, PrefixCache, PrefixCachedScheduler
from asap.scheduler.request import Request
from asap.studies.experiments import trace_requests
from asap.sim.memory import prefix_cache_capacity
from asap.sim.run import get_hardware, get_model, run
from asap.workload.traces import default_trace_path, read_trace
from asap.workload.workload import Workload

SMALL = dict(model_cfg="small-deepseek-v3", hardware="h800")
ONE_SYNC = dict(devices=2, attention_tp=2)              # one DP group of 2 devices
ONE_ASYNC = dict(devices=3, attention_workers=1)        # one attention replica + 2 expert workers


# ---- the policy ----
def test_lru_evicts_the_least_recently_used_block_and_a_match_refreshes():
    c = PrefixCache(3)
    c.insert([1, 2])
    c.insert([3])
    assert c.match([1, 2]) == 2            # 1 and 2 are now more recent than 3
    c.insert([4])
    assert 3 not in c and all(b in c for b in (1, 2, 4)) and len(c) == 3
    assert c.num_evicted_blocks == 1


def test_eviction_takes_a_prefix_tail_before_its_head():
    c = PrefixCache(2)
    c.insert([10, 11, 12])
    assert 12 not in c and c.match([10, 11, 12]) == 2


def test_match_counts_only_the_leading_run_of_blocks():
    c = PrefixCache(None)
    c.insert([1, 2, 3])
    assert c.match([1, 9, 3]) == 1         # 3 is held, but after a miss it cannot be reused
    assert c.match([9, 2, 3]) == 0
    assert c.match([1, 2, 3, 4]) == 3
    assert (c.num_lookups, c.num_hit_blocks, c.num_miss_blocks) == (3, 4, 6)
    assert c.hit_rate == pytest.approx(0.4)


@pytest.mark.parametrize("bad", [-1, 1.5, True, "10"])
def test_a_bad_capacity_is_refused(bad):
    with pytest.raises(ValueError, match="capacity_blocks"):
        PrefixCache(bad)


def test_the_scheduler_skips_cached_blocks_but_always_computes_the_last_token():
    s = PrefixCachedScheduler(16384, PrefixCache(None))
    ids = tuple(range(8))
    first = Request(0, 8 * BLOCK_TOKENS + 100, hash_ids=ids + (99,))    # a partial last block: never cached
    s.add(first)
    assert first.num_computed == 0
    s.commit(s.schedule(0.0))
    assert all(b in s.cache for b in ids) and 99 not in s.cache
    again = Request(1, 8 * BLOCK_TOKENS, hash_ids=ids)                  # fully cached
    s.add(again)
    assert again.num_computed == 8 * BLOCK_TOKENS - 1 and s.schedule(1.0) == {1: 1}
    assert s.num_cached_tokens == 8 * BLOCK_TOKENS - 1


# ---- capacity from memory ----
def test_capacity_matches_hand_arithmetic_for_deepseek_v3_on_cloudmatrix384():
    m, hw = get_model("deepseek-v3"), get_hardware("cloudmatrix384")
    # by hand: 64 GB per die, 10% reserve; FP8 weights: 17,117,633,536 attention-side parameters and
    # 58 MoE layers x 256 experts x 3 x 7168 x 2048 = 653,908,770,816 expert parameters; MLA caches
    # 512 + 64 elements per token and layer in BF16 over 61 layers: 70,272 B per token.
    attention, experts, block = 17_117_633_536, 653_908_770_816, 70_272 * 512
    assert prefix_cache_capacity("sync", m, hw, 32, 1) == math.floor((57.6e9 - attention - experts / 32) / block) == 557
    assert prefix_cache_capacity("sync", m, hw, 32, 8) == math.floor((57.6e9 - attention / 8 - experts / 32) / block) \
        == 973                                              # MLA: every TP device holds the whole latent
    assert prefix_cache_capacity("async", m, hw, 32, 1) == math.floor((57.6e9 - attention) / block) == 1125


def test_gqa_kv_is_split_over_attention_tp_and_mla_is_not():
    hw = get_hardware("h800")
    for name, split in (("qwen3-235b-a22b", 4), ("deepseek-v3", 1)):
        m = get_model(name)
        one, four = prefix_cache_capacity("async", m, hw, 32, 1), prefix_cache_capacity("async", m, hw, 32, 4)
        a = m.attention_cost()
        block = a.kv_cache_elems * 2 * m.num_layers * BLOCK_TOKENS
        attn = m.num_params()["attention_side"] * hw.weight_bytes
        assert four == math.floor((0.9 * hw.memory_bytes - attn / 4) * split / block) and four > one


# ---- the workload carries the block hashes ----
def test_the_shipped_sample_keeps_its_hash_ids_and_requests_carry_them():
    reqs = trace_requests(num_requests=50)
    assert all(len(r.hash_ids) == -(-r.num_tokens // BLOCK_TOKENS) for r in reqs)
    assert reqs[0].hash_ids[0] == reqs[1].hash_ids[0]       # the trace's shared first block
    clipped = Workload(trace=default_trace_path(), num_requests=50, max_tokens=1000,
                       with_prompts=False).build()
    assert all(len(r.hash_ids) <= 2 for r in clipped)
    scaled = Workload(trace=default_trace_path(), num_requests=5, length_scale=0.5,
                      with_prompts=False).build()
    assert all(r.hash_ids == () for r in scaled)


def test_bad_hash_ids_get_a_clear_error(tmp_path):
    for value, msg in (([1, "x"], "list of integers"), ([1, 2, 3], "at most 2 blocks")):
        p = tmp_path / "t.jsonl"
        p.write_text(json.dumps({"timestamp": 0, "input_length": 600, "output_length": 1, "hash_ids": value}) + "\n")
        with pytest.raises(ValueError, match=msg):
            read_trace(p)


# ---- both engines ----
def _repeated(n_blocks=8, gap=1000.0):
    ids = tuple(range(100, 100 + n_blocks))
    return [Request(0, n_blocks * BLOCK_TOKENS, 0.0, hash_ids=ids), Request(1, n_blocks * BLOCK_TOKENS, gap, hash_ids=ids)]


@pytest.mark.parametrize("engine,shape", [("sync", ONE_SYNC), ("async", ONE_ASYNC)])
def test_a_repeated_prompt_hits_on_the_same_replica_and_gets_a_shorter_ttft(engine, shape):
    res = run(_repeated(), engine, **SMALL, **shape, prefix_cache=True)
    first, second = (r.ttft for r in res.results)
    assert 0 < second < 0.5 * first                         # still at least one step: the last token runs
    pc = res.stats["prefix_cache"]
    assert pc["cached_tokens"] == 8 * BLOCK_TOKENS - 1 and pc["hit_blocks"] == 8 and pc["looked_blocks"] == 16


@pytest.mark.parametrize("engine,shape", [("sync", dict(devices=2)), ("async", dict(devices=4, attention_workers=2))])
def test_each_replica_has_its_own_cache(engine, shape):
    reqs = [dataclasses.replace(r, id=i, arrival=1000.0 * i) for i, r in enumerate(_repeated() + _repeated())][:3]
    res = run(reqs, engine, **SMALL, **shape, router="round-robin", prefix_cache=True)
    # round-robin: 0 -> replica 0 (miss), 1 -> replica 1 (miss: its own cache is empty), 2 -> replica 0 (hit)
    assert res.stats["prefix_cache"]["hit_blocks"] == 8
    assert res.results[2].ttft < 0.5 * res.results[1].ttft


@pytest.mark.parametrize("engine,shape", [("sync", ONE_SYNC), ("async", ONE_ASYNC)])
def test_cache_off_is_todays_behaviour(engine, shape):
    reqs = trace_requests(num_requests=12)
    plain = [dataclasses.replace(r, hash_ids=()) for r in reqs]
    off = run(reqs, engine, **SMALL, **shape)
    assert [r.ttft for r in off.results] == [r.ttft for r in run(plain, engine, **SMALL, **shape).results] \
        == [r.ttft for r in run(reqs, engine, **SMALL, **shape, prefix_cache=False).results]
    assert "prefix_cache" not in off.stats
    with pytest.raises(ValueError, match="prefix_cache=True"):
        run(reqs, engine, **SMALL, **shape, prefix_cache_blocks=10)


def test_both_engines_apply_the_same_policy():
    """Requests far enough apart that each prefill ends before the next arrives: both engines' caches see
    the same lookups and inserts, so they report what a bare PrefixCache replay of the trace gives."""
    reqs = [dataclasses.replace(r, arrival=1000.0 * i) for i, r in enumerate(trace_requests(num_requests=40))]
    cap = 60
    ref, cached = PrefixCache(cap), 0
    for r in reqs:
        blocks = r.hash_ids[:r.num_tokens // BLOCK_TOKENS]
        cached += min(ref.match(blocks) * BLOCK_TOKENS, r.num_tokens - 1)
        ref.insert(blocks)
    stats = {e: run(reqs, e, **SMALL, **shape, prefix_cache=True, prefix_cache_blocks=cap).stats["prefix_cache"]
             for e, shape in (("sync", ONE_SYNC), ("async", ONE_ASYNC))}
    assert stats["sync"] == stats["async"]
    s = stats["sync"]
    assert (s["hit_blocks"], s["cached_tokens"], s["evicted_blocks"]) == (ref.num_hit_blocks, cached,
                                                                          ref.num_evicted_blocks)
    assert s["hit_blocks"] > 0 and s["evicted_blocks"] > 0      # the case exercises hits and eviction


def test_headline_flag_runs_every_candidate_with_the_cache_and_prints_its_hit_rate(tmp_path, capsys):
    from asap.studies.__main__ import main
    trace = tmp_path / "trace.jsonl"
    lines = []
    for i in range(120):                    # 5 conversations whose prompts share their prefix
        n = 500 + (i * 997) % 7500
        lines.append(json.dumps({"timestamp": 100 * i, "input_length": n, "output_length": 1,
                                 "hash_ids": [1000 * (i % 5) + j for j in range(-(-n // BLOCK_TOKENS))]}) + "\n")
    trace.write_text("".join(lines))
    assert main(["headline", "--devices", "4", "--workloads", str(trace), "--num-requests", "120", "--model",
                 "small-deepseek-v3", "--hardware", "h800", "--slo", "0.005s+0.001ms/tok", "--slo-scales", "1.0",
                 "--out", str(tmp_path), "--prefix-cache"]) == 0
    printed = capsys.readouterr().out
    data = json.loads((tmp_path / "headline.json").read_text())
    assert data["prefix_cache"] is True
    for engine in ("sync", "async"):
        row = data["rows"][0][engine]
        assert all(c["config"]["prefix_cache"] for c in row["candidates"])
        assert 0 < row["prefix_hit_rate"] < 1 and f"prefix cache: on, hit rate {row['prefix_hit_rate']:.1%}" in printed
