"""vLLM 0.32's processor-cache mirror fault in the shared cache model (``caches.model``,
``OrderedCache(stale_fault=True)``), against an independent replay of the API server's sender.

The sender judges a request's items cached, touches them, then walks the items: a cached one is
a hit, a missing one is inserted (evicting least recent entries); an item judged cached but
evicted by this request's own insert fails the request there (a miss, not inserted, the walk
stops). The model must agree on every flag, counter and entry, and the order band's exact
search must agree with brute force when the fault is on."""
from __future__ import annotations

from collections import OrderedDict

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from mmdatagen.caches import get_target, make_cache
from mmdatagen.caches.model import OrderedCache
from mmdatagen.loadgen.band import order_band
from tests.test_band import brute_force, items_of, workloads


def sender(requests: list[list[tuple[int, int]]], capacity: int) -> tuple[list, list, list]:
    """Per request: the flags of the items walked, the failing index (None: passed); and the
    entries at the end (least recent first)."""
    cache: OrderedDict[int, int] = OrderedDict()
    flags_all, faults = [], []
    for items in requests:
        judged = [k in cache for k, _ in items]
        for k, _ in items:
            if k in cache:
                cache.move_to_end(k)
        flags, fault = [], None
        for n, (k, size) in enumerate(items):
            if k in cache:
                cache.move_to_end(k)
                flags.append(True)
                continue
            flags.append(False)
            if judged[n]:
                fault = n
                break
            if size > capacity:
                continue
            while sum(cache.values()) + size > capacity:
                cache.popitem(last=False)
            cache[k] = size
        flags_all.append(flags)
        faults.append(fault)
    return flags_all, faults, list(cache.items())


@settings(max_examples=400, deadline=None)
@given(reqs=st.lists(st.lists(st.tuples(st.integers(0, 6), st.sampled_from([1, 2, 3])),
                              max_size=5), max_size=8),
       capacity=st.integers(0, 8))
def test_model_fails_where_the_sender_fails(reqs, capacity):
    size_of: dict[int, int] = {}
    reqs = [[(k, size_of.setdefault(k, sz)) for k, sz in r] for r in reqs]  # a key, one size
    want_flags, want_faults, want_entries = sender(reqs, capacity)
    cache = make_cache(get_target("vllm-processor"), capacity, engine_faults=True)
    assert isinstance(cache, OrderedCache) and cache.stale_fault
    for r, (items, flags, fault) in enumerate(zip(reqs, want_flags, want_faults)):
        assert cache.lookup(r, items) == flags
        assert cache.last_fault == fault
    assert list(cache.entries()) == want_entries
    assert cache.queries == sum(len(f) for f in want_flags)
    assert cache.hits == sum(sum(f) for f in want_flags)


def test_the_mirror_bug_workload_in_miniature():
    """Two items that do not fit together, the second judged cached: inserting the first
    evicts it, and the request fails at it; without engine faults it is a plain miss."""
    reqs = [[(1, 2)], [(0, 2), (1, 2)]]
    target = get_target("vllm-processor")
    faulting = make_cache(target, 3, engine_faults=True)
    plain = make_cache(target, 3)
    assert [faulting.lookup(r, it) for r, it in enumerate(reqs)] == [[False], [False, False]]
    assert faulting.last_fault == 1 and faulting.keys() == [0]
    assert [plain.lookup(r, it) for r, it in enumerate(reqs)] == [[False], [False, False]]
    assert plain.keys() == [1] and plain.queries == 3 == faulting.queries


@settings(max_examples=200, deadline=None)
@given(w=workloads(max_requests=4))
def test_exact_search_with_faults_equals_brute_force(w):
    target = get_target("vllm-processor")
    make = lambda: make_cache(target, w["capacity"], engine_faults=True)  # noqa: E731
    low, high, _ = brute_force(target, w, make)
    items, images = items_of(target, w)
    b = order_band(target, items, images, w["capacity"], w["s"], w["f"], w["fin"], [w["w"]],
                   make, w["fail"])
    assert b.bounds[0] == (round(low), round(high))
    lo, hi = order_band(target, items, images, w["capacity"], w["s"], w["f"], w["fin"],
                        [w["w"]], make, w["fail"], budget=0).bounds[0]
    assert lo <= low <= high <= hi  # past the search: a bound that still holds
    assert np.isfinite(lo)
