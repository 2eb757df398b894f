"""The order band (``loadgen/band.py``) against brute force: every order consistent with the
windows, replayed through the target's own cache model.

Invariants: the exact search equals brute force; the stack bound contains it (so the exact
replay in send order lies in every band); where no windows overlap the band is the exact replay,
width 0. The distinct-size range sums behind the stack bound equal a naive count. For vLLM's
encoder cache and Dynamo's two tiers, the block search and the age search (past the exact one)
contain brute force and the first-token engine's hits; the block search equals brute force on
up to three requests of one item each; both are the replay without overlaps. Brute force skips
draws of more than ``MAX_ORDERS`` orders.
"""
from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, reject, settings
from hypothesis import strategies as st

import mmdatagen.loadgen.band as band_module
from mmdatagen.caches import get_target, make_cache
from mmdatagen.loadgen.band import (
    METHODS,
    RangeSums,
    _events,
    coarse_band,
    known_order,
    order_band,
)

STACK_TARGETS = ("vllm-processor", "sglang-vlm")
ALL_TARGETS = ("vllm-processor", "sglang-vlm", "vllm-processor-shm", "vllm-encoder",
               "dynamo-encode", "dynamo-embedding")
TIER_TARGETS = ("vllm-encoder", "dynamo-embedding", "dynamo-connector")


@st.composite
def workloads(draw, max_requests: int = 6, max_events_requests: int = 6):
    n = draw(st.integers(1, max_requests))
    pool = draw(st.integers(1, 5))
    sizes = draw(st.lists(st.sampled_from([1, 2, 3, 5]), min_size=pool, max_size=pool))
    keys = [draw(st.lists(st.integers(0, pool - 1), max_size=4)) for _ in range(n)]
    starts = sorted(draw(st.lists(st.integers(0, 30), min_size=n, max_size=n)))
    spans = draw(st.lists(st.integers(0, 10), min_size=n, max_size=n))
    later = draw(st.lists(st.integers(0, 4), min_size=n, max_size=n))
    weights = draw(st.lists(st.sampled_from([0.0, 1.0]), min_size=n, max_size=n))
    fail = draw(st.lists(st.booleans(), min_size=n, max_size=n))
    capacity = draw(st.integers(0, 10))
    s = np.array(starts, np.int64)
    f = s + np.array(spans, np.int64)
    return {"keys": keys, "sizes": sizes, "s": s, "f": f, "fin": f + np.array(later),
            "w": np.array(weights), "fail": fail, "capacity": capacity}


def items_of(target, w: dict) -> tuple[list, list[int]]:
    """The requests' cache items as bench makes them (one set item for a set-keyed cache)."""
    out = []
    for ks in w["keys"]:
        it = [(k, w["sizes"][k]) for k in ks]
        if target.entry == "embedding-set":
            it = [(("set", *ks), sum(w["sizes"][k] for k in ks))] if ks else []
        out.append(it)
    return out, [len(ks) for ks in w["keys"]]


def factory(target, capacity: int):
    if target.front is not None:
        return lambda: make_cache(target, capacity, front_tokens=4, bytes_per_token=1)
    return lambda: make_cache(target, capacity)


def stack(target) -> bool:
    return target.front is None and target.eviction == "lru" and target.insert_on_lookup


# brute force replays every order: a draw with more (five requests all overlapping: 113,400
# orders, 20 s) is rejected, so a test's time does not hang on its seed (most draws: < 100)
MAX_ORDERS = 10_000
MAX_EVENTS = 16  # (counting the orders walks every subset of the events)


def _orders(before: list[set[int]]) -> int:
    """How many orders of the events respect ``before`` (a count over subsets, not a walk)."""
    n = len(before)
    need = [sum(1 << i for i in b) for b in before]
    ways = [0] * (1 << n)
    ways[0] = 1
    for done in range(1 << n):
        if ways[done]:
            for j in range(n):
                if not done >> j & 1 and need[j] & done == need[j]:
                    ways[done | 1 << j] += ways[done]
    return ways[-1]


def apart(w: dict) -> dict:
    """The workload with each item a request of its own, in its request's windows, weight and
    failure (a request without items stays one): the orders of a target that frees item by
    item (vLLM's encoder cache, alone or in front of Dynamo's tier)."""
    own = [p for p, ks in enumerate(w["keys"]) for _ in (ks or [None])]
    keys = [part for ks in w["keys"] for part in ([[k] for k in ks] or [[]])]
    times = {c: np.asarray(w[c])[own] for c in ("s", "f", "fin", "fin_lo", "w") if c in w}
    return {**w, **times, "keys": keys, "fail": [w["fail"][p] for p in own]}


def brute_force(target, w: dict, make=None, items_alone: bool | None = None
                ) -> tuple[float, float, float]:
    """(lowest, highest, send order's) hits over every consistent order of the events
    (``make``: the empty cache, default the target's); rejects a draw of more than
    :data:`MAX_ORDERS` orders. ``items_alone`` (default: the target frees item by item): each
    item a request of its own (``apart``)."""
    if target.releases if items_alone is None else items_alone:
        w = apart(w)
    items, images = items_of(target, w)
    unit = [max(1, n) if target.entry == "embedding-set" else 1 for n in images]
    ev = _events(w["s"], w["f"], None if stack(target) else w["fin"])
    if len(ev) > MAX_EVENTS:
        reject()
    before = [{i for i in range(len(ev)) if ev[i][1] < ev[j][0]
               or (ev[i][3] == ev[j][3] and ev[i][2] < ev[j][2])} for j in range(len(ev))]
    if _orders(before) > MAX_ORDERS:
        reject()
    make = make or factory(target, w["capacity"])

    def hits(order: list[int]) -> float:
        cache, total = make(), 0.0
        for j in order:
            _, _, kind, p = ev[j]
            if kind == 0:
                total += sum(cache.lookup(p, items[p])) * unit[p] * w["w"][p]
            else:
                (cache.abort if w["fail"][p] else cache.finish)(p)
        return total

    values: list[float] = []

    def walk(order: list[int], done: set[int]) -> None:
        if len(order) == len(ev):
            values.append(hits(order))
        for j in range(len(ev)):
            if j not in done and before[j] <= done:
                walk(order + [j], done | {j})

    walk([], set())
    return min(values), max(values), hits(list(range(len(ev))))


def band(target, w: dict, **kw):
    items, images = items_of(target, w)
    return order_band(target, items, images, w["capacity"], w["s"], w["f"], w["fin"],
                      [w["w"]], factory(target, w["capacity"]), w["fail"], **kw)


@settings(max_examples=300, deadline=None)
@given(w=workloads(), name=st.sampled_from(STACK_TARGETS))
def test_stack_bound_contains_every_order(w, name):
    target = get_target(name)
    low, high, sent = brute_force(target, w)
    b = band(target, w, budget=0)  # no search: the stack bound answers
    assert b.method == "stack bound"
    lo, hi = b.bounds[0]
    assert lo <= low <= high <= hi
    assert lo <= sent <= hi
    if known_order(w["s"], w["f"]):
        assert lo == hi == sent  # nothing open: the bound is the replay itself


@settings(max_examples=250, deadline=None)
@given(w=workloads(max_requests=4), name=st.sampled_from(ALL_TARGETS))
def test_exact_search_equals_brute_force(w, name):
    target = get_target(name)
    low, high, sent = brute_force(target, w)
    b = band(target, w)
    assert b.bounds[0] == (round(low), round(high))
    assert b.method in ("exact search", "known order")


def _end_to_end(w: dict, name: str, gap: int):
    """Lay the workload's windows end to end (one request at a time); the target and the
    hits of the send-order replay."""
    n = len(w["keys"])
    w["s"] = np.arange(n, dtype=np.int64) * 20 * gap
    w["f"] = w["s"] + 5
    w["fin"] = w["s"] + 9
    target = get_target(name)
    _, _, sent = brute_force(target, w, items_alone=False)  # (item by item: the same replay)
    return target, sent


@settings(max_examples=100, deadline=None)
@given(w=workloads(), name=st.sampled_from(ALL_TARGETS), gap=st.integers(1, 5))
def test_width_zero_without_overlap(w, name, gap):
    """Windows laid end to end (concurrency 1): the band is the send-order replay (for a target
    that frees item by item, it holds it: a request's items are freed in any order)."""
    target, sent = _end_to_end(w, name, gap)
    b = band(target, w)
    lo, hi = b.bounds[0]
    assert b.known_order and lo <= round(sent) <= hi
    if not target.releases:
        assert lo == hi
    if stack(target):
        assert band(target, w, budget=0).bounds[0] == (round(sent), round(sent))


@settings(max_examples=100, deadline=None)
@given(w=workloads(), name=st.sampled_from(ALL_TARGETS))
def test_coarse_bound_contains_every_order(w, name):
    target = get_target(name)
    if stack(target):
        return  # the stack bound answers for these
    low, high, _ = brute_force(target, w)
    lo, hi = band(target, w, budget=0).bounds[0]
    assert lo <= low <= high <= hi


@settings(max_examples=80, deadline=None)
@given(w=workloads(max_requests=4), name=st.sampled_from(ALL_TARGETS),
       after=st.sampled_from(METHODS))
def test_a_band_after_a_method_skips_the_searches_before_it(w, name, after):
    """bench's band for any scheduler starts where the first-come band ended (``after``): the
    methods before it are not tried (unless the order is known), and the band still holds
    every order."""
    target = get_target(name)
    low, high, _ = brute_force(target, w)
    b = band(target, w, after=after)
    lo, hi = b.bounds[0]
    assert lo <= low <= high <= hi
    if b.method != "known order":
        assert METHODS.index(b.method) >= METHODS.index(after), (b.method, after)


def test_one_new_image_in_two_overlapping_requests_is_one_hit():
    """Whichever of two concurrent requests came first misses and the other hits: exactly one
    hit in every order, and both methods say so (the per-key search couples the two)."""
    target = get_target("vllm-processor")
    w = {"keys": [[0], [0]], "sizes": [3], "s": np.array([0, 1]), "f": np.array([10, 10]),
         "fin": np.array([10, 10]), "w": np.ones(2), "fail": [False, False], "capacity": 10}
    assert not known_order(w["s"], w["f"])
    assert band(target, w).bounds[0] == (1, 1)
    assert band(target, w, budget=0).bounds[0] == (1, 1)


def test_reordering_can_evict():
    """A cache of one entry, a repeat of image 0 with image 1 in a request that may arrive
    between them: one hit in send order, none when the other request came in between."""
    target = get_target("vllm-processor")
    w = {"keys": [[0], [1], [0]], "sizes": [2, 2], "s": np.array([0, 10, 12]),
         "f": np.array([5, 30, 20]), "fin": np.array([5, 30, 20]), "w": np.ones(3),
         "fail": [False] * 3, "capacity": 2}
    assert band(target, w).bounds[0] == (0, 1)
    assert band(target, w, budget=0).bounds[0] == (0, 1)


@settings(max_examples=200, deadline=None)
@given(keys=st.lists(st.lists(st.integers(0, 6), max_size=3), min_size=1, max_size=25),
       data=st.data())
def test_range_sums_equal_a_naive_count(keys, data):
    sizes = {k: 1 + 3 * k for k in range(7)}
    pos, prev, size, last = [], [], [], {}
    for p, ks in enumerate(keys):
        for k in dict.fromkeys(ks):
            pos.append(p)
            prev.append(last.get(k, -1))
            size.append(sizes[k])
            last[k] = p
    sums = RangeSums(np.array(pos, np.int64), np.array(prev, np.int64),
                     np.array(size, np.int64), len(keys))
    n = len(keys)
    lo = np.array(data.draw(st.lists(st.integers(0, n), min_size=5, max_size=5)))
    hi = np.array(data.draw(st.lists(st.integers(-1, n - 1), min_size=5, max_size=5)))
    got = sums(lo, hi)
    for a, b, g in zip(lo, hi, got):
        assert g == sum(sizes[k] for k in {k for ks in keys[a:b + 1] for k in ks})


# -- first come, first served: windows on the first-token axis ----------------------------------
@st.composite
def fcfs_runs(draw, failures: bool = True, max_requests: int = 6):
    """A small first-come-first-served engine, item by item as vLLM's scheduler goes:
    requests arrive (send plus a processing delay that may reorder them) and wait in arrival
    order; each step has a token budget, spent on the running requests first (in order), then
    on waiting ones while budget is left (chunked prefill). A prompt is text and items (an
    item's tokens: its size); an item is looked up when a step's chunk first reaches it and
    freed at the end of the step whose chunk passes it, so a prefill over several steps frees
    its first items before it looks up the next. A request's first token leaves at the end of
    the step that finishes its prefill; the client sees it a little later (less than the tie).
    Some requests fail before the engine (their lookups at arrival, then freed). The truth:
    (time, rank, kind, request, item), kind 0 a lookup, 1 a release."""
    n = draw(st.integers(1, max_requests))
    gaps = draw(st.lists(st.integers(0, 40), min_size=n, max_size=n))
    s = np.cumsum(gaps).astype(np.int64)
    arrive = s + np.array(draw(st.lists(st.integers(0, 30), min_size=n, max_size=n)))
    pool = draw(st.integers(1, 4))
    sizes = draw(st.lists(st.sampled_from([1, 2, 3]), min_size=pool, max_size=pool))
    keys = [draw(st.lists(st.integers(0, pool - 1), max_size=3)) for _ in range(n)]
    spans, need = [], []  # each item's [start, end) in its prompt; the prompt's length
    for ks in keys:
        pos, mine = 0, []
        for k in ks:
            pos += draw(st.integers(0, 1))  # text before the item
            mine.append((pos, pos + sizes[k]))
            pos += sizes[k]
        spans.append(mine)
        need.append(pos + 1)  # the text after the last item
    failed = draw(st.lists(st.booleans(), min_size=n, max_size=n)) \
        if failures and draw(st.booleans()) else [False] * n
    jitter = draw(st.lists(st.integers(0, 2), min_size=n, max_size=n))
    budget, step = draw(st.integers(1, 5)), draw(st.integers(10, 30))
    events: list[tuple[int, int, int, int, int]] = []
    first = np.full(n, -1, np.int64)
    end = np.zeros(n, np.int64)
    order = sorted(range(n), key=lambda i: (arrive[i], i))
    for i in order:
        if failed[i]:  # looked up at arrival, then gone (the reply right after)
            a = int(arrive[i])
            events += [(a, len(events), 0, i, k) for k in range(len(keys[i]))]
            events += [(a, len(events), 1, i, k) for k in range(len(keys[i]))]
            end[i] = a + 1
    waiting = [i for i in order if not failed[i]]
    done_tokens, looked, freed = [0] * n, [0] * n, [0] * n
    running: list[int] = []
    t = 0

    def chunk(i: int, room: int) -> int:
        take = min(need[i] - done_tokens[i], room)
        top = done_tokens[i] + take
        while looked[i] < len(spans[i]) and spans[i][looked[i]][0] < top:
            events.append((t, len(events), 0, i, looked[i]))
            looked[i] += 1
        done_tokens[i] = top
        return take

    while waiting or running:
        room, ran = budget, []
        for i in running:
            if room > 0:
                room -= chunk(i, room)
                ran.append(i)
        while waiting and room > 0 and arrive[waiting[0]] <= t:
            i = waiting.pop(0)
            room -= chunk(i, room)
            running.append(i)
            ran.append(i)
        for i in ran:  # the end of the step: what the chunks passed is freed
            while freed[i] < len(spans[i]) and spans[i][freed[i]][1] <= done_tokens[i]:
                events.append((t + step, len(events), 1, i, freed[i]))
                freed[i] += 1
            if done_tokens[i] == need[i]:
                first[i] = t + step + jitter[i]
                end[i] = first[i] + 1
        running = [i for i in running if done_tokens[i] < need[i]]
        t += step
    return {"s": s, "first": first, "end": end, "truth": sorted(events), "keys": keys,
            "sizes": sizes, "capacity": draw(st.integers(0, 6)), "fail": failed,
            "arrival": [i for i in order if not failed[i]]}


def _fcfs(run: dict, later: bool):
    from mmdatagen.loadgen.band import fcfs_windows

    reply = np.where(run["first"] >= 0, run["first"], run["end"])
    return fcfs_windows(run["s"], run["first"], reply, reply if later else None, tie_ns=3)


def true_hits(target, run: dict) -> int:
    """The target's hits over the engine's true order: item by item for a target that frees
    item by item (each item looked up and freed as a request of its own), else a request's
    items at its first lookup and its later moment at its last release."""
    items, _ = items_of(target, run)
    cache, hits = factory(target, run["capacity"])(), 0
    by_item = target.releases
    for _, _, kind, p, k in run["truth"]:
        last = k == len(run["keys"][p]) - 1
        if kind == 0 and (by_item or k == 0):
            hits += sum(cache.lookup((p, k) if by_item else p,
                                     items[p][k:k + 1] if by_item else items[p]))
        elif kind == 1 and (by_item or last):
            (cache.abort if run["fail"][p] else cache.finish)((p, k) if by_item else p)
    return hits


@settings(max_examples=400, deadline=None)
@given(run=fcfs_runs())
def test_fcfs_windows_hold_the_engines_order(run):
    """The engine's true order of lookups and releases, item by item, is one the windows allow
    (each item in its request's windows): no event is forced before one that truly came
    earlier."""
    _holds(run, _fcfs(run, later=True))


@settings(max_examples=300, deadline=None)
@given(run=fcfs_runs(failures=False), name=st.sampled_from(TIER_TARGETS),
       keep=st.sampled_from([1, 8]), ordered=st.booleans(), sets=st.booleans())
def test_chunked_band_contains_the_engines_hits(run, name, keep, ordered, sets):
    """The chunked band (``loadgen.chunked``: the first-token groups as steps, each step's
    prompts cut anywhere in its first one) holds the hits of the engine's true order, item by
    item, also with its states joined down to one per structure after each group, with each
    group in arrival order (a server log's), and with every group searched by sets (its
    items released in any order), as groups of over ``MAX_ORDERS`` sequences are."""
    from mmdatagen.loadgen.chunked import MAX_ORDERS, chunked_band, steps

    target = get_target(name)
    fw = _fcfs(run, later=False)
    pos = np.argsort(fw.lo, kind="stable")
    if ordered:
        rank = {p: r for r, p in enumerate(run["arrival"])}
        pos = np.array(sorted(pos.tolist(), key=lambda p: (fw.lo[p], rank[p])), np.int64)
    lo = fw.lo[pos]
    groups = steps(lo)
    items, _ = items_of(target, run)
    got = chunked_band(groups, [items[p] for p in pos], np.ones((1, pos.size)),
                       factory(target, run["capacity"])(), budget=10**9, ordered=ordered,
                       keep=keep, by_orders=0 if sets else MAX_ORDERS)
    assert got is not None
    (low, high), = got[0]
    truth = true_hits(target, run)
    assert low <= truth <= high, (got, truth)


@settings(max_examples=300, deadline=None)
@given(data=st.data(), name=st.sampled_from(TIER_TARGETS), capacity=st.integers(1, 7),
       joined=st.booleans())
def test_chunked_band_by_sets_holds_the_band_by_orders(data, name, capacity, joined):
    """A group searched by sets (its items released in any order at the next group's first
    cut) is a bound: it holds the band over every order of its members, with the states of
    a set joined past ``SET_KEEP`` or never. Up to 6 requests (720 orders each; 7 took 23-45 s
    of the fast suite): the found cases below have 6 and 7."""
    n = data.draw(st.integers(3, 6))
    pool = data.draw(st.integers(2, 5))
    sizes = data.draw(st.lists(st.sampled_from([1, 2, 3]), min_size=pool, max_size=pool))
    keys = [data.draw(st.lists(st.integers(0, pool - 1), max_size=2)) for _ in range(n)]
    cuts = sorted(set(data.draw(st.lists(st.integers(1, n - 1), max_size=2))))
    groups = [list(range(a, b)) for a, b in zip([0, *cuts], [*cuts, n])]
    items, _ = items_of(get_target(name), {"keys": keys, "sizes": sizes})
    _sets_hold_orders(name, capacity, groups, items, joined)


def test_first_come_band_goes_by_sets_past_its_budget():
    """Steps in no known order whose search by orders runs out of work (on the Dynamo stack
    it did on 5 of 11 runs of 32 requests, their states multiplying across steps of 2 to 4)
    are searched again, every step by sets, with half the budget: the band bench reports is
    that bound, which holds the one by orders. Steps in a known order (a server log's) have
    no such fallback; nor has a search by sets that runs out too (bench then gives the band
    over any order)."""
    from unittest import mock

    from mmdatagen.loadgen import chunked

    target = get_target("dynamo-embedding")
    keys = [[3, 1, 4], [2, 0, 3], [0, 4, 1], [4, 0, 2], [2, 5, 0], [3, 2, 0], [0, 2, 5], [4, 0, 5]]
    items, _ = items_of(target, {"keys": keys, "sizes": [2, 1, 1, 1, 1, 3]})
    groups, gain = [[0, 1, 2], [3, 4], [5, 6, 7]], np.ones((1, 8))
    search = chunked.chunked_band
    budgets: list[tuple[int, int]] = []

    def orders_run_out(*args, by_orders: int = chunked.MAX_ORDERS, **kw):
        budgets.append((args[4], by_orders))
        return None if by_orders else search(*args, by_orders=by_orders, **kw)

    def band(budget: int = 10**9, **kw):
        return chunked.first_come_band(groups, items, gain, factory(target, 7)(), budget, **kw)

    by_orders = band()
    assert by_orders is not None and by_orders[1] in ("chunked search", "chunked bound")
    by_sets = search(groups, items, gain, factory(target, 7)(), 10**9, by_orders=0)
    assert by_sets is not None
    with mock.patch.object(chunked, "chunked_band", orders_run_out):
        assert band(10**6) == (by_sets[0], "chunked bound by sets")
        assert budgets == [(10**6, chunked.MAX_ORDERS), (10**6 // 2, 0)]
        assert band(10**6, ordered=True) is None
    ((low, high),), ((set_low, set_high),) = by_orders[0], by_sets[0]
    assert set_low <= low <= high <= set_high
    assert band(1_000) is None  # too little work for either


@pytest.mark.parametrize("name,capacity,groups,items", [
    # the batch's items all as if released last would keep one that the true order evicts
    ("vllm-encoder", 7, [[0, 1, 2, 3], [4], [5]],
     [[], [], [(2, 3), (0, 1)], [(2, 3), (3, 3)], [(1, 2), (2, 3)], [(3, 3)]]),
    # all as if released first would evict one that the true order keeps
    ("dynamo-embedding", 6, [[0, 1, 2, 3, 4], [5, 6]],
     [[], [], [(4, 2)], [(0, 3), (3, 1)], [(4, 2), (0, 3)], [(0, 3), (2, 2)], [(2, 2), (3, 1)]]),
])
def test_a_batch_release_spans_every_place(name, capacity, groups, items):
    """Found by a search: a batch released in any order gives each item the ages of every place
    in that release, from last to first; either end alone drops an order (checked), with no
    states joined inside a group (joins widen the band past what would show it)."""
    _sets_hold_orders(name, capacity, groups, items, joined=False)


def _sets_hold_orders(name: str, capacity: int, groups: list, items: list,
                      joined: bool) -> None:
    """The chunked band with every group searched by sets (``joined``: its states joined past
    ``SET_KEEP``, else never) holds the exact one by orders."""
    from unittest import mock

    from mmdatagen.loadgen import chunked

    target, n = get_target(name), len(items)
    with mock.patch.object(chunked, "SET_KEEP", chunked.SET_KEEP if joined else 10**6):
        bands = [chunked.chunked_band(groups, items, np.ones((1, n)),
                                      factory(target, capacity)(), budget=10**9, keep=10**6,
                                      by_orders=by) for by in (10**9, 0)]
    assert bands[0] is not None and bands[1] is not None
    ((low, high),), exact = bands[0]
    ((set_low, set_high),), _ = bands[1]
    assert exact and set_low <= low <= high <= set_high, (bands, groups, items)


def test_chunked_scripts_are_the_distinct_cuts():
    """One item: a cut before its lookup, after it (inside it or past it), or both."""
    from mmdatagen.loadgen.chunked import _scripts

    assert sorted(_scripts(1, must_cut=True)) == sorted([
        (("L", 0), ("C", 0)), (("L", 0), ("C", 1)), (("C", 0), ("L", 0)),
        (("C", 0), ("L", 0), ("C", 1))])
    assert (("L", 0),) in _scripts(1, must_cut=False)
    assert _scripts(0, must_cut=True) == [(("C", 0),)]
    two = _scripts(2, must_cut=True)
    assert len(two) == len(set(two)) and all(sum(w == "L" for w, _ in s) == 2 for s in two)


def _holds(run: dict, w) -> None:
    lo = {(0, i): w.lo[i] for i in range(len(run["s"]))}
    hi = {(0, i): w.hi[i] for i in range(len(run["s"]))}
    for i in range(len(run["s"])):
        lo[(1, i)], hi[(1, i)] = w.later_lo[i], w.later_hi[i]
    truth = [(kind, i) for _, _, kind, i, _ in run["truth"]]
    for a, x in enumerate(truth):
        for y in truth[a + 1:]:
            assert not hi[y] < lo[x], (x, y, run)


@settings(max_examples=300, deadline=None)
@given(run=fcfs_runs(), name=st.sampled_from(("vllm-processor", "dynamo-encode")))
def test_fcfs_band_contains_the_engines_hits(run, name):
    """The band over the windows holds the hits of the engine's true order (a target that
    frees item by item has its own first-come band: ``test_chunked_band_...``)."""
    target = get_target(name)
    items, images = items_of(target, run)
    make = factory(target, run["capacity"])
    truth = true_hits(target, run)
    fw = _fcfs(run, later=not stack(target))
    pos = np.argsort(fw.lo, kind="stable")
    pick = [items[p] for p in pos]
    b = order_band(target, pick, [images[p] for p in pos], run["capacity"], fw.lo[pos],
                   fw.hi[pos], None if fw.later_hi is None else fw.later_hi[pos],
                   [np.ones(len(pos))], make, [run["fail"][p] for p in pos],
                   fin_lo=None if fw.later_lo is None else fw.later_lo[pos])
    lo, hi = b.bounds[0]
    assert lo <= truth <= hi, (b, truth)


def test_fcfs_groups_order_what_the_send_times_leave_open():
    """Eight requests sent at once, first tokens in three engine steps: the send windows
    allow any order, the first tokens fix the steps' order and leave each step's open."""
    from mmdatagen.loadgen.band import fcfs_windows

    s = np.zeros(8, np.int64)
    first = np.array([100, 101, 102, 200, 201, 300, 301, 302], np.int64)
    w = fcfs_windows(s, first, first, None, tie_ns=5)
    assert w.lo.tolist() == [100] * 3 + [200] * 2 + [300] * 3
    assert w.hi.tolist() == [102] * 3 + [201] * 2 + [302] * 3
    assert not known_order(s, first)
    assert known_order(w.lo[[0, 3, 5]], w.hi[[0, 3, 5]])  # the steps are ordered
    assert w.largest == 3
    dense = fcfs_windows(np.zeros(100, np.int64), np.arange(100, dtype=np.int64) * 1000, None,
                         None, tie_ns=5_000)  # no steps apart: one group of everything
    assert dense.largest == 100 and len(set(dense.lo.tolist())) == 1


def test_tie_window_joins_one_steps_first_tokens_behind_a_frontend():
    """First tokens as clients saw them at concurrency 8 on two cores: one step's spread over up
    to 24 ms behind Dynamo's frontend with steps 110 ms apart or more (prefills of 875 tokens),
    6.3 ms behind vLLM's with steps 26 ms apart. The window from the run's own gaps keeps each
    step one group and the steps apart (a fixed 5 ms split steps, and the band missed the
    engine's count); with no step of several first tokens (concurrency 1) it is ``TIE_NS``."""
    from mmdatagen.loadgen.band import TIE_NS, fcfs_windows, tie_window

    rng = np.random.default_rng(7)
    for spread, apart in ((24.0, 110.0), (6.3, 26.0)):
        steps = np.cumsum(spread + apart + rng.uniform(0, 90, 30))  # last to next first
        first_ms = np.concatenate([t + np.sort(rng.uniform(0, spread, 3)) for t in steps])
        first_ms[1::3] = first_ms[0::3] + spread  # the widest spread seen, in every step
        first = (first_ms * 1e6).astype(np.int64)
        sent = np.repeat(((np.r_[0.0, steps[:-1] + spread] + 1) * 1e6).astype(np.int64), 3)
        assert spread * 1e6 < tie_window(first, sent) < apart * 1e6
        w = fcfs_windows(sent, first, first, None)
        step_of = np.repeat(np.arange(steps.size), 3)
        assert all(len(set(w.lo[step_of == k].tolist())) == 1 for k in range(steps.size))
        assert len(set(w.lo.tolist())) == steps.size
    lone = (np.cumsum(rng.uniform(40, 300, 50)) * 1e6).astype(np.int64)
    assert tie_window(lone) == TIE_NS


# A run of the Dynamo stack (tests/real_engine/test_dynamo_stack.py, sliding-window sessions in
# random order at concurrency 8, 2026-12-02): first tokens and send times as the client saw them
# (ms from the first send, in first-token order). The engine's own trace looked up the request
# at 1946.8 before those at 1937.7 and 1938.4: one step, its first tokens 9.1 ms apart.
DYNAMO_FIRST_MS = [847.3, 1601.8, 1937.7, 1938.4, 1946.8, 2599.6, 2599.7, 2785.5, 2785.8, 2785.9,
                   2912.4, 2912.7, 3069.7, 3069.8, 3069.8, 3164.9, 3164.9, 3267.8, 3268.0,
                   3268.2, 3436.9, 3614.2, 3614.3, 3806.5, 3806.6, 3806.6, 3806.6, 3894.3,
                   3894.5, 3972.9, 3974.1, 4027.7]
DYNAMO_SENT_MS = [78.1, 0.0, 24.9, 7.1, 54.0, 33.0, 42.2, 1610.7, 66.7, 1941.5, 2616.1, 2610.8,
                  2621.5, 2791.5, 2819.4, 2942.7, 2965.7, 3078.6, 3075.0, 2955.5, 3189.1, 3196.9,
                  3204.6, 3354.1, 3378.7, 3360.4, 3364.9, 3436.7, 3647.5, 3813.5, 3809.2, 3902.2]


def test_tie_window_takes_the_widest_jump_that_splits_no_step():
    """The gaps between those first tokens jump twice: from 1.2 to 8.4 ms (the steeper) and from
    8.4 to 53.7 ms. The steeper jump's window (5 ms) split the engine's step, which it looked
    up in another order than the first tokens came; the higher one joins it, and keeps the
    steps 54 ms and more apart as groups."""
    from mmdatagen.loadgen.band import fcfs_windows, tie_window

    first = (np.array(DYNAMO_FIRST_MS) * 1e6).astype(np.int64)
    sent = (np.array(DYNAMO_SENT_MS) * 1e6).astype(np.int64)
    tie = tie_window(first, sent)
    assert 8.4e6 < tie < 53.7e6
    w = fcfs_windows(sent, first, first, None)
    assert len(set(w.lo[2:5].tolist())) == 1  # the engine's step: one group
    assert w.lo[1] < w.lo[2] < w.lo[5]  # and the steps beside it apart
    assert len(set(w.lo.tolist())) == 15


def test_tie_window_does_not_join_steps_across_idle_gaps():
    """A GPU engine's bursts: steps 10-14 ms apart, each with first tokens within 1 ms of each
    other, every request after the first step sent just after an earlier step's first token,
    bursts a second apart. The largest jump in the gaps (steps to idle) would make a window
    of 50 ms, joining the steps of a burst: it would put requests sent after a first token in
    that token's step, so the window stays at ``TIE_NS`` and every step is its own group."""
    from mmdatagen.loadgen.band import TIE_NS, fcfs_windows, tie_window

    rng = np.random.default_rng(11)
    first, sent, step_of = [], [], []
    t = 0.0
    for burst in range(6):
        prev = t - 1.0  # the burst's first requests: sent just before it
        for step in range(8):
            t += rng.uniform(10, 14)
            for j in range(2):
                first.append(t + 0.4 * j)
                sent.append(prev + 0.5)
                step_of.append(burst * 8 + step)
            prev = t
        t += 1000.0
    first_ns = (np.array(first) * 1e6).astype(np.int64)
    sent_ns = (np.array(sent) * 1e6).astype(np.int64)
    assert tie_window(first_ns) == 50_000_000  # without the send times: the idle jump
    assert tie_window(first_ns, sent_ns) == TIE_NS
    w = fcfs_windows(sent_ns, first_ns, first_ns, None)
    assert len(set(w.lo.tolist())) == len(set(step_of))


# -- vLLM's encoder cache and Dynamo's two tiers past the exact search ---------------------------


def tier_bands(target, w: dict, keep: int = 1
               ) -> tuple[tuple[int, int] | None, tuple[int, int] | None]:
    """The block search's and the age search's bands (no exact search before them; the age
    search keeps ``keep`` states per placed set: 1, every state joined, tests the joins)."""
    from mmdatagen.loadgen.band import age_search, block_search

    items, _ = items_of(target, w)
    ev = _events(w["s"], w["f"], w["fin"], w.get("fin_lo"))
    gain = np.asarray(w["w"], np.float64)[None, :]
    cache = factory(target, w["capacity"])()
    blocks = block_search(ev, items, gain, cache)
    ages = age_search(ev, items, gain, cache, keep=keep)
    return (None if blocks is None else blocks[0]), (None if ages is None else ages[0][0])


@settings(max_examples=300, deadline=None)
@given(w=workloads(max_requests=5), name=st.sampled_from(TIER_TARGETS))
def test_tier_searches_contain_every_order(w, name):
    """Both searches hold every consistent order's hits (the block search stands for the
    orders within its blocks, the age search for every order its intervals allow)."""
    target = get_target(name)
    low, high, sent = brute_force(target, w, items_alone=False)
    blocks, ages = tier_bands(target, w)
    assert blocks is not None and ages is not None
    assert blocks[0] <= low <= high <= blocks[1], (blocks, low, high)
    assert ages[0] <= low <= high <= ages[1], (ages, low, high)


def test_the_age_search_gets_what_the_searches_before_it_left():
    """Past the exact and block searches, the age search gets half the budget or what they left
    of seven eighths, whichever is more: they give up as soon as their pace says they would
    not finish, and a crowded step (eight requests' first tokens within a millisecond, on a
    fast engine) left the age search more work than half, so the band fell to the coarse
    bound (0..66 of 22 lookups on a real Dynamo; 0..13 with this rule)."""
    from mmdatagen.loadgen.band import age_search

    rng = np.random.default_rng(2)
    n, pool = 12, 8
    w = {"keys": [list(rng.integers(0, pool, 1)) for _ in range(n)],  # one item each
         "sizes": list(rng.choice([1, 2, 3, 5], pool))}
    starts = np.sort(rng.integers(0, 40, n)).astype(np.int64)
    f = starts + rng.integers(5, 15, n)
    w.update(s=starts, f=f, fin=f + rng.integers(0, 4, n), w=np.ones(n), fail=[False] * n,
             capacity=6)
    target = get_target("dynamo-embedding")
    items, _ = items_of(target, w)
    ev = _events(w["s"], w["f"], w["fin"])
    gain = np.ones((1, n))
    spent: list[int] = []
    assert age_search(ev, items, gain, factory(target, 6)(), 10**12, spent=spent) is not None
    budget = int(spent[0] / 0.6)  # the age search needs 60 % of it
    assert age_search(ev, items, gain, factory(target, 6)(), budget // 2) is None
    got = band(target, w, budget=budget)
    assert got.method == "age bound", got


@settings(max_examples=150, deadline=None)
@given(w=workloads(max_requests=3), name=st.sampled_from(TIER_TARGETS))
def test_block_search_bounds_a_few_requests_and_is_exact_for_single_items(w, name):
    """The block band contains brute force's. With one item per request it is brute force's;
    with several it can be wider where requests overlap (found: 0..1 where every order gives 0,
    the blocks not keeping which of a request's own items is the more recent)."""
    target = get_target(name)
    low, high, _ = brute_force(target, w, items_alone=False)
    blocks, _ = tier_bands(target, w)
    assert blocks is not None and blocks[0] <= low <= high <= blocks[1], (blocks, low, high)
    single = {**w, "keys": [ks[:1] for ks in w["keys"]]}
    low, high, _ = brute_force(target, single)
    assert tier_bands(target, single)[0] == (round(low), round(high))


@settings(max_examples=100, deadline=None)
@given(w=workloads(), name=st.sampled_from(TIER_TARGETS), gap=st.integers(1, 5))
def test_tier_searches_width_zero_without_overlap(w, name, gap):
    """Requests one at a time: both searches give the send-order replay."""
    target, sent = _end_to_end(w, name, gap)
    blocks, ages = tier_bands(target, w)
    assert blocks == ages == (round(sent), round(sent))


def _coarse_by_definition(items, unit, s, f, weights):
    """The coarse bound item by item: a key's first item in its request is a certain miss
    when every other request holding the key is sent after this one's first byte."""
    holders: dict = {}
    for p, it in enumerate(items):
        for key in dict.fromkeys(k for k, _ in it):
            holders.setdefault(key, []).append(p)
    out = []
    for w in weights:
        high = 0.0
        for p, it in enumerate(items):
            seen: set = set()
            for key, _ in it:
                cold = key not in seen and all(s[q] > f[p] for q in holders[key] if q != p)
                high += 0.0 if cold else float(w[p]) * unit[p]
                seen.add(key)
        out.append((0, round(high)))
    return out


@settings(max_examples=300, deadline=None)
@given(data=st.data(), n=st.integers(0, 30), pool=st.integers(1, 6), ordered=st.booleans())
def test_coarse_bound_equals_its_definition(data, n, pool, ordered):
    """The vectorised coarse bound (each key's two earliest senders) equals the item-by-item
    definition, with repeated keys in a request and tied send times; positions in send order
    (``order_band``'s) or not."""
    items = [[(k, 1) for k in data.draw(st.lists(st.integers(0, pool - 1), max_size=4))]
             for _ in range(n)]
    s = np.array(data.draw(st.lists(st.integers(0, 8), min_size=n, max_size=n)), np.int64)
    s = np.sort(s) if ordered else s
    f = s + np.array(data.draw(st.lists(st.integers(0, 5), min_size=n, max_size=n)), np.int64)
    unit = data.draw(st.lists(st.integers(1, 3), min_size=n, max_size=n))
    weights = [np.array(data.draw(st.lists(st.sampled_from([0.0, 1.0]), min_size=n,
                                           max_size=n))), np.ones(n)]
    assert coarse_band(items, unit, s, f, weights) == _coarse_by_definition(
        items, unit, s, f, weights)


@settings(max_examples=200, deadline=None)
@given(w=workloads(max_requests=12), later=st.booleans(), low=st.booleans())
def test_events_are_the_windows_sorted_by_low_then_kind_then_position(w, later, low):
    """``_events`` (numpy) equals its definition: lookups ``[s, f]`` and later moments
    ``[max(fin_lo, s), max(fin, f)]``, sorted by window low, lookups first, then position."""
    s, f, n = w["s"], w["f"], w["s"].size
    fin = w["fin"] if later else None
    fin_lo = (s + f) // 2 if low else None
    want = [(int(s[p]), int(f[p]), 0, p) for p in range(n)]
    if fin is not None:
        lo = s if fin_lo is None else np.maximum(fin_lo, s)
        want += [(int(lo[p]), int(max(fin[p], f[p])), 1, p) for p in range(n)]
    assert _events(s, f, fin, fin_lo) == sorted(want, key=lambda e: (e[0], e[2], e[3]))


@settings(max_examples=300, deadline=None)
@given(w=workloads(max_requests=6), name=st.sampled_from(ALL_TARGETS),
       budget=st.sampled_from([0, 20, 200, 2_000, 200_000]), head=st.integers(1, 6),
       after=st.sampled_from([None, *METHODS]))
def test_a_search_over_the_head_of_the_events_answers_as_over_all(w, name, budget, head, after):
    """Each search first runs over the first ``PROBE_EVENTS`` events and gives up there as it
    would over the whole list; needing more, it runs again over all: the band, its method and
    the work the searches spent are those of the whole list."""
    target = get_target(name)
    whole = band(target, w, budget=budget, after=after)
    saved = band_module.PROBE_EVENTS, band_module.PROBE_FROM
    band_module.PROBE_EVENTS, band_module.PROBE_FROM = head, 0
    try:
        assert band(target, w, budget=budget, after=after) == whole
    finally:
        band_module.PROBE_EVENTS, band_module.PROBE_FROM = saved


@settings(max_examples=300, deadline=None)
@given(w=workloads(max_requests=8), name=st.sampled_from(ALL_TARGETS), head=st.integers(1, 6),
       budget=st.sampled_from([0, 10, 40, 200, 2_000, 10**9]),
       search=st.sampled_from(["exact", "block", "age"]))
def test_each_search_over_a_head_answers_and_spends_as_over_all(w, name, head, budget, search):
    """``_EventLists.run``: a search over the head that gives up there has the answer and the
    work of the search over every event; one that needs more is run over every event."""
    from mmdatagen.loadgen.band import (
        _event_columns,
        _EventLists,
        _last_lookups,
        age_search,
        block_search,
    )
    from mmdatagen.loadgen.band import exact_search as exact

    target = get_target(name)
    if search != "exact" and target.name not in TIER_TARGETS:
        return  # the block and age searches are vLLM's encoder cache's and Dynamo's
    items, _ = items_of(target, w)
    gain = np.asarray(w["w"], np.float64)[None, :]
    args = (w["s"], w["f"], None if stack(target) else w["fin"], None)
    make = factory(target, w["capacity"])
    run = {"exact": lambda ev, sp, last: exact(ev, items, gain, make, w["fail"], budget, sp,
                                               last),
           "block": lambda ev, sp, last: block_search(ev, items, gain, make(), budget, sp, last),
           "age": lambda ev, sp, last: age_search(ev, items, gain, make(), budget, spent=sp,
                                                  last=last)}[search]
    spent_all: list[int] = []
    want = run(_events(*args), spent_all, _last_lookups(_event_columns(*args), items))
    saved = band_module.PROBE_EVENTS, band_module.PROBE_FROM
    band_module.PROBE_EVENTS, band_module.PROBE_FROM = head, 0
    try:
        spent: list[int] = []
        assert _EventLists(args, items).run(run, spent) == want
        assert spent == spent_all
    finally:
        band_module.PROBE_EVENTS, band_module.PROBE_FROM = saved


def _groups_by_definition(first, slack, tie_ns):
    """First tokens in order, each joining the last group while its low is within ``tie_ns``
    of that group's end: (start, end) per group and each token's group."""
    t_lo, t_hi = first - slack, first + slack
    groups, member = [], [0] * first.size
    for k in np.argsort(first, kind="stable").tolist():
        if groups and t_lo[k] - groups[-1][1] <= tie_ns:
            groups[-1] = (groups[-1][0], max(groups[-1][1], int(t_hi[k])))
        else:
            groups.append((int(t_lo[k]), int(t_hi[k])))
        member[k] = len(groups) - 1
    return groups, member


@settings(max_examples=300, deadline=None)
@given(data=st.data(), n=st.integers(0, 25), tie=st.integers(0, 6))
def test_first_token_groups_equal_their_definition(data, n, tie):
    """``_TokenAxis`` groups first tokens (numpy) as the token-by-token definition does, with
    a clock slack per request."""
    from mmdatagen.loadgen.band import _TokenAxis

    first = np.array(data.draw(st.lists(st.integers(0, 40), min_size=n, max_size=n)), np.int64)
    slack = np.array(data.draw(st.lists(st.integers(0, 5), min_size=n, max_size=n)), np.int64)
    axis = _TokenAxis(first - 3, first, np.ones(n, bool), slack, tie)
    groups, member = _groups_by_definition(first, slack, tie)
    assert list(zip(axis.starts.tolist(), axis.ends.tolist())) == groups
    assert axis.member.tolist() == member
