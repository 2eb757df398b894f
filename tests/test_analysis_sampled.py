"""Policies answered by replays (FIFO, insert at completion): the batched compiled kernels, many
capacities a pass, equal the one-capacity replays (themselves checked against the cache model
and OrderedDict oracles), compiled and in plain Python; the batched threshold search returns
what a binary search one replay at a time returns, whether or not hits rise with capacity."""
from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from mmdatagen.analysis import concurrency, kernels
from mmdatagen.analysis import sampled as S
from mmdatagen.analysis.targets import fifo_flags
from mmdatagen.analysis.trace import Trace


@st.composite
def cases(draw):
    m = draw(st.integers(1, 10))
    sizes = np.array(draw(st.lists(st.integers(1, 9), min_size=m, max_size=m)), np.int64)
    rows = draw(st.lists(st.lists(st.integers(0, m - 1), min_size=0, max_size=4),
                         min_size=1, max_size=30))
    lens = np.array([len(r) for r in rows], np.int64)
    modality = (np.array(draw(st.lists(st.integers(0, 2), min_size=m, max_size=m)), np.int64)
                if draw(st.booleans()) else None)
    trace = Trace(np.array([x for r in rows for x in r], np.int64),
                  np.repeat(np.arange(len(rows)), lens), len(rows), np.ones(m, np.int64),
                  np.ones(m, np.int64), modality=modality)
    caps = np.array(draw(st.lists(st.integers(0, int(sizes.sum()) + 2), min_size=1,
                                  max_size=70)), np.int64)
    return trace, sizes, sizes * 3 + 1, caps


def _compiled(on: bool):
    """Force the compiled (True) or the plain-Python (False) kernels."""
    old = kernels.PYTHON_MAX_REFS
    kernels.PYTHON_MAX_REFS = -1 if on else 1 << 40
    return old


@settings(max_examples=150, deadline=None)
@given(cases(), st.booleans(), st.booleans())
def test_fifo_batches_equal_one_replay_per_capacity(case, unit, compiled):
    trace, sizes, tokens, caps = case

    def flags(cap, unit_):
        return fifo_flags(trace, np.ones_like(sizes) if unit_ else sizes, cap)
    want = S.flag_counter(trace, sizes, tokens, flags)(caps, unit, -np.ones(caps.size))
    old = _compiled(compiled)
    try:
        got = S.fifo_counter(trace, sizes, tokens)(caps, unit, -np.ones(caps.size))
    finally:
        kernels.PYTHON_MAX_REFS = old
    assert got == want


@settings(max_examples=150, deadline=None)
@given(cases(), st.booleans(), st.integers(1, 4), st.booleans(), st.booleans())
def test_completion_batches_equal_one_replay_per_capacity(case, unit, in_flight, flush,
                                                          compiled):
    trace, sizes, tokens, caps = case
    ev = concurrency.events(trace.num_rows, in_flight)
    row_start = np.searchsorted(trace.ref_row, np.arange(trace.num_rows + 1))

    def flags(cap, unit_):
        w = np.ones_like(sizes) if unit_ else sizes
        return concurrency.completion_flags(ev, row_start, trace.ids, w, cap,
                                            "flush" if flush else "bypass")
    want = S.flag_counter(trace, sizes, tokens, flags)(caps, unit, -np.ones(caps.size))
    old = _compiled(compiled)
    try:
        got = S.completion_counter(trace, sizes, tokens, ev, flush)(caps, unit,
                                                                    -np.ones(caps.size))
    finally:
        kernels.PYTHON_MAX_REFS = old
    assert got == want


def test_tree_unit_packs_what_fits_and_divides_by_the_common_factor():
    assert S.tree_unit(np.array([4096, 8192, 0])) == (4, 4096)
    assert S.tree_unit(np.array([3, 5])) == (4, 1)
    assert S.tree_unit(np.array([(1 << 59) + 2, 3])) is None  # with a count, past 2^61


@settings(max_examples=100, deadline=None)
@given(cases(), st.booleans(), st.sampled_from([4096, 1 << 52]))
def test_one_at_a_time_with_large_sizes_equals_the_replay(case, compiled, factor):
    """Sizes with a large common factor (the recency pass counts in units of it) and sizes too
    large to pack a size and a count in one number (the general replay answers): the same
    counts as one replay per capacity (the bytes counted stay below 2^63)."""
    trace, sizes, tokens, caps = case
    odd = factor > 4096  # then no common factor: nothing to divide by
    sizes, caps = sizes * factor + odd, caps * factor
    row_start = np.searchsorted(trace.ref_row, np.arange(trace.num_rows + 1))
    ev = concurrency.events(trace.num_rows, 1)

    def flags(cap, unit_):
        w = np.ones_like(sizes) if unit_ else sizes
        return concurrency.completion_flags(ev, row_start, trace.ids, w, cap, "bypass")
    want = S.flag_counter(trace, sizes, tokens, flags)(caps, False, -np.ones(caps.size))
    old = _compiled(compiled)
    try:
        got = S.completion_counter(trace, sizes, tokens, None, False)(caps, False,
                                                                      -np.ones(caps.size))
    finally:
        kernels.PYTHON_MAX_REFS = old
    assert got == want


def _sequential(table: dict, need: float, hi: int) -> int | None:
    """The binary search one count at a time (what the analysis did before batching)."""
    if table[hi] < need:
        return None
    grid = np.arange(hi + 1) if hi <= S.GRID_EXACT else np.unique(np.r_[
        0, np.geomspace(1, hi, int(np.log(hi) / np.log(1 + S.GRID_STEP)) + 2).astype(np.int64),
        hi])
    lo, top = 0, grid.size - 1
    while lo < top:
        mid = (lo + top) // 2
        if table[int(grid[mid])] >= need:
            top = mid
        else:
            lo = mid + 1
    return int(grid[lo])


@settings(max_examples=200, deadline=None)
@given(st.integers(1, 200), st.lists(st.integers(0, 60), min_size=201, max_size=201),
       st.lists(st.integers(0, 70), min_size=1, max_size=4), st.booleans())
def test_batched_search_equals_the_sequential_search(hi, counts, needs, rising):
    """Any hit counts (rising or not): the same answers; and each replayed batch holds the
    capacities the walks could not decide."""
    counts = sorted(counts) if rising else counts
    table = {c: counts[c] for c in range(hi + 1)}
    batches = []

    def counter(caps: np.ndarray, unit: bool, needs: np.ndarray) -> list:
        batches.append(caps.tolist())
        return [{"hits": table[int(c)]} for c in caps]
    got = S.Points(counter).smallest(needs, hi, False)
    assert got == [_sequential(table, n, hi) for n in needs]
    assert len(batches) <= 3 + 11 * len(needs)


def test_search_on_a_geometric_grid_replays_a_few_batches():
    """A large range is searched on its 1 % grid; rising counts need few batches."""
    hi = 10 ** 9
    calls = []

    def counter(caps: np.ndarray, unit: bool, needs: np.ndarray) -> list:
        calls.append(caps.size)
        return [{"hits": int(np.sqrt(c))} for c in caps]
    pts = S.Points(counter)
    got = pts.smallest([100.0, 30_000.0, 31_622.0], hi, False)
    table = {c: int(np.sqrt(c)) for c in (int(g) for g in np.unique(np.r_[
        0, np.geomspace(1, hi, int(np.log(hi) / np.log(1 + S.GRID_STEP)) + 2).astype(np.int64),
        hi]))}
    assert got == [_sequential(table, n, hi) for n in (100.0, 30_000.0, 31_622.0)]
    assert len(calls) <= 5


@pytest.mark.parametrize("limit", [2, 16, 400])
def test_sampled_curve_capacities(limit):
    """From the smallest entry to all distinct entries, geometrically, ``limit`` at most."""
    sizes = np.array([5, 7, 100, 1], np.int64)  # the object of size 1 is never referenced
    caps = S.sample_caps(sizes, np.array([0, 1, 0, 2]), limit, 4, 10 ** 8, 1)
    assert caps[0] == 5 and caps[-1] == 112 and np.all(np.diff(caps) > 0)
    assert caps.size <= limit


@settings(max_examples=150, deadline=None)
@given(cases(), st.booleans(), st.booleans(), st.data())
def test_a_replay_asked_about_a_hit_target_stops_only_below_it(case, fifo, compiled, data):
    """Asked whether capacities reach a hit count, a replay may stop early, and then only where
    the exact count is below it; otherwise it counts everything."""
    trace, sizes, tokens, caps = case
    ev = concurrency.events(trace.num_rows, data.draw(st.integers(1, 3)))
    counter = (S.fifo_counter(trace, sizes, tokens) if fifo
               else S.completion_counter(trace, sizes, tokens, ev, False))
    needs = np.array([data.draw(st.integers(-1, trace.ids.size)) for _ in caps], np.float64)
    old = _compiled(compiled)
    try:
        exact = counter(caps, False, -np.ones(caps.size))
        got = counter(caps, False, needs)
    finally:
        kernels.PYTHON_MAX_REFS = old
    for e, g, need in zip(exact, got, needs):
        assert (g is None and e["hits"] < need) or g == e


def test_thresholds_of_a_fifo_equal_the_search_one_replay_at_a_time():
    """On a trace where FIFO hits do not rise everywhere with capacity, the batched search with
    replays that stop early answers as the one-replay-at-a-time search on exact counts."""
    rng = np.random.default_rng(5)
    m, n = 60, 4000
    ids = (rng.zipf(1.2, n) % m).astype(np.int64)
    sizes = rng.integers(1, 40, m).astype(np.int64)
    trace = Trace(ids, np.arange(n) // 3, int(np.arange(n)[-1] // 3) + 1,
                  np.ones(m, np.int64), np.ones(m, np.int64))
    hi = int(sizes.sum()) + 1
    exact = {c: int(fifo_flags(trace, sizes, c).sum()) for c in range(hi + 1)}
    assert any(exact[c + 1] < exact[c] for c in range(hi)), "Belady's anomaly expected"
    best = exact[hi]
    needs = [0.9 * best, 0.99 * best, best]
    pts = S.Points(S.fifo_counter(trace, sizes, sizes))
    assert pts.smallest(needs, hi, False) == [_sequential(exact, k, hi) for k in needs]
    assert pts.below, "some replays stopped early"


@st.composite
def one_at_a_time_cases(draw):
    """Requests of up to 8 images with repeats, sizes of a few entries to larger than some
    capacities, so every path runs: counts from bounds (every entry fits), small direct
    replays, general replays (many entries, one larger)."""
    m = draw(st.integers(1, 12))
    sizes = np.array(draw(st.lists(st.sampled_from([1, 1, 2, 3, 5, 40]), min_size=m,
                                   max_size=m)), np.int64)
    rows = draw(st.lists(st.lists(st.integers(0, m - 1), min_size=0, max_size=8),
                         min_size=1, max_size=40))
    lens = np.array([len(r) for r in rows], np.int64)
    trace = Trace(np.array([x for r in rows for x in r], np.int64),
                  np.repeat(np.arange(len(rows)), lens), len(rows), np.ones(m, np.int64),
                  np.ones(m, np.int64))
    return trace, sizes


@settings(max_examples=300, deadline=None)
@given(one_at_a_time_cases(), st.booleans(), st.booleans())
def test_one_request_at_a_time_equals_the_cache_model(case, unit, compiled):
    """Insert at completion, one request at a time (dynamo-encode as analyze runs it): the
    counts at every capacity equal the shared cache model replayed request by request, where
    hits need not rise with capacity for a reference (its request's others decide where it
    sits in the recency order)."""
    from dataclasses import replace

    from mmdatagen.analysis.targets import Replay
    from mmdatagen.caches import get_target

    trace, sizes = case
    w = np.ones_like(sizes) if unit else sizes
    replay = Replay(replace(get_target("dynamo-encode"), oversize="bypass"), trace, w)
    caps = np.arange(int(w.sum()) + 2, dtype=np.int64)
    want = S.flag_counter(trace, sizes, sizes, lambda c, u: replay.flags(c))(
        caps, unit, -np.ones(caps.size))
    ev = concurrency.events(trace.num_rows, 1)
    old = _compiled(compiled)
    try:
        counter = S.completion_counter(trace, sizes, sizes, ev, False)
        got = counter(caps, unit, -np.ones(caps.size))
    finally:
        kernels.PYTHON_MAX_REFS = old
    assert got == want
