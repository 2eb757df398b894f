"""Dynamo's aggregated embedding cache as deployed: the connector behind vLLM's encoder cache
(``caches.model.TieredCache``) against an independent replay, and the rules the real engine
showed (real-engine reference: a single byte LRU is wrong in both directions)."""
from __future__ import annotations

from analysis_oracle import replay_two_tier
from hypothesis import given, settings
from hypothesis import strategies as st

from mmdatagen.caches import get_target, make_cache
from mmdatagen.caches.model import TieredCache

BPT = 256  # the tiny Qwen2-VL's bytes per embedding token (hidden 128 x bf16)


def _replay(rows, tokens, budget, capacity):
    cache = make_cache(get_target("dynamo-embedding"), capacity, front_tokens=budget,
                       bytes_per_token=BPT)
    assert isinstance(cache, TieredCache)
    per_row = []
    for rid, row in enumerate(rows):
        flags = cache.lookup(rid, [(k, tokens[k] * BPT) for k in row])
        per_row.append((flags, list(cache.last_front)))
        cache.finish(rid)
    return cache, per_row


@settings(max_examples=300, deadline=None)
@given(st.data())
def test_tiered_cache_equals_the_independent_replay(data):
    n = data.draw(st.integers(1, 12))
    tokens = {k: data.draw(st.sampled_from([4, 64, 391, 1222])) for k in range(n)}
    rows = data.draw(st.lists(st.lists(st.integers(0, n - 1), min_size=1, max_size=4),
                              min_size=1, max_size=40))
    # the exact regime: a request's distinct items fit the encoder budget together (vLLM
    # schedules a larger one in chunks, releasing the earlier items on the way)
    budget = max(sum(tokens[k] for k in set(r)) for r in rows) * data.draw(st.integers(1, 3))
    capacity = data.draw(st.integers(0, sum(tokens.values()) * BPT))
    cache, per_row = _replay(rows, tokens, budget, capacity)
    want = replay_two_tier(rows, tokens, {k: t * BPT for k, t in tokens.items()}, budget,
                           capacity)
    got = cache.counters()
    assert (got["encoder_hits"], got["hits"], got["misses"], got["evictions"]) == (
        want["encoder_hits"], want["hits"], want["misses"], want["evictions"])
    assert got["encoder_runs"] == got["misses"]  # a connector hit loads instead of encoding
    refs = sum(len(r) for r in rows)
    assert got["queries"] + got["encoder_hits"] == refs
    for flags, front in per_row:  # a front hit is never a connector hit
        assert not any(f and s for f, s in zip(flags, front))


def test_front_hits_do_not_refresh_the_connector():
    """An image kept warm only by the encoder cache ages out of Dynamo's LRU and misses there
    later (one of the two ways a single LRU is wrong)."""
    tokens = {"a": 100, "b": 100, "c": 100, "d": 100}
    # encoder cache: 2 items; connector: 2 entries
    rows = [["a"], ["a"], ["b"], ["c"], ["d"], ["a"]]
    cache, per_row = _replay(rows, tokens, budget=200, capacity=2 * 100 * BPT)
    c = cache.counters()
    assert per_row[1] == ([False], [True])  # the repeat of a: the encoder cache, not Dynamo
    assert c["encoder_hits"] == 1 and c["misses"] == 5 and c["hits"] == 0
    assert c["evictions"] == 3


def test_oversize_entry_is_not_saved_and_evicts_nothing():
    tokens = {"small": 10, "huge": 1000}
    rows = [["small"], ["huge"], ["small"]]
    cache, _ = _replay(rows, tokens, budget=1000, capacity=50 * BPT)
    c = cache.counters()
    assert c["evictions"] == 0 and "huge" not in cache and "small" in cache


def test_a_single_lru_would_disagree():
    """A plain byte LRU counts the encoder cache's repeats as its own hits."""
    tokens = {k: 100 for k in "abc"}
    rows = [["a"], ["a"], ["a"], ["b"], ["c"], ["a"]]
    cache, _ = _replay(rows, tokens, budget=300, capacity=3 * 100 * BPT)
    c = cache.counters()
    assert (c["hits"], c["misses"], c["encoder_hits"]) == (0, 3, 3)


@settings(max_examples=300, deadline=None)
@given(data=st.data(), target=st.sampled_from(["dynamo-embedding", "dynamo-connector",
                                               "vllm-encoder"]))
def test_the_compiled_replay_equals_the_cache_model(data, target):
    """``analysis.tiers.event_hits`` (the loader's replay of vLLM's encoder cache, alone or
    before Dynamo's connector) gives every request the hits and lookups ``caches.model`` gives
    it, over any order of lookups and releases (finished or failed), a request's repeated
    items, entries that never fit, and requests never looked up."""
    import numpy as np

    from mmdatagen.caches.items import RequestItems
    from mmdatagen.loadgen.predict import ImageTracker, RequestColumns, _Request
    from mmdatagen.vlm import generic_model

    n = data.draw(st.integers(1, 12))
    size_of = data.draw(st.lists(st.integers(0, 9), min_size=6, max_size=6))  # 0: undecodable
    rows = [data.draw(st.lists(st.integers(0, 5), max_size=4)) for _ in range(n)]
    bpt = data.draw(st.sampled_from([1, 2, 3]))
    cache = get_target(target)
    room = data.draw(st.integers(0, 30))  # bytes behind the front, or the front's tokens
    tracker = ImageTracker(generic_model(1, bpt), cache,
                           room / 2**30 if cache.unit == "GiB" else room, None,
                           data.draw(st.integers(1, 12)))
    assert tracker.target.capacity(tracker.capacity) == room
    tracker.real_engine = data.draw(st.booleans())
    looked = data.draw(st.permutations(range(n)))[:data.draw(st.integers(0, n))]
    events: list[tuple[int, int]] = []
    for r in looked:  # each lookup, its release (or none) anywhere after it
        events.insert(data.draw(st.integers(0, len(events))), (0, r))
        kind = data.draw(st.sampled_from([0, 1, 2]))
        if kind:
            at = events.index((0, r)) + 1
            events.insert(data.draw(st.integers(at, len(events))), (kind, r))
    ev = (np.array([k for k, _ in events], np.int64), np.array([r for _, r in events], np.int64))
    tracker.requests = [_Request([(k, size_of[k]) for k in row], len(row)) for row in rows]
    fast = tracker.replay(ev)
    tracker.requests = RequestColumns.of(tracker.requests)
    assert isinstance(tracker.requests.items, RequestItems)
    tracker._compiled_tiers = lambda capacity: None  # the cache model, request by request
    slow = tracker.replay(ev)
    assert fast[0].tolist() == slow[0].tolist() and fast[1].tolist() == slow[1].tolist()


def test_a_connector_of_no_bytes_holds_not_even_an_empty_entry():
    """Found by the property above: behind a front of 1 token, a request repeats an
    undecodable image (entry size 0) after the request that first used it has finished. The
    connector has 0 bytes, so it is off: the model counts no hit there; the compiled replay
    counted one (an LRU of 0 bytes keeps an entry of 0 bytes)."""
    import numpy as np

    from mmdatagen.loadgen.predict import ImageTracker, RequestColumns, _Request
    from mmdatagen.vlm import generic_model

    tracker = ImageTracker(generic_model(1, 1), get_target("dynamo-embedding"), 0.0, None, 1)
    tracker.real_engine = False
    ev = (np.array([0, 1, 0], np.int64), np.array([0, 0, 1], np.int64))  # r0, r0 done, r1
    tracker.requests = [_Request([(1, 0), (3, 1)], 2), _Request([(0, 1), (1, 0)], 2)]
    fast = tracker.replay(ev)
    tracker.requests = RequestColumns.of(tracker.requests)
    tracker._compiled_tiers = lambda capacity: None  # the cache model, request by request
    slow = tracker.replay(ev)
    assert fast[0].tolist() == slow[0].tolist() == [0, 0]
    assert fast[1].tolist() == slow[1].tolist()
