"""The analysis on several threads answers exactly what it answers on one: the stack pass split
into two halves and joined, the tiers beside the main pass, FIFO and insert-at-completion
replays dealt over threads, and one request at a time cut into parts of the trace. Traces here
are short, so the compiled kernels and the threads are forced."""
from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from mmdatagen.analysis import Semantics, analyze, kernels
from mmdatagen.analysis import sampled as S
from mmdatagen.analysis.lru import required_capacities
from mmdatagen.analysis.targets import first_ids
from mmdatagen.analysis.trace import Trace
from mmdatagen.caches import get_target, target_names
from mmdatagen.vlm import get_model

DIMS = np.array([(512, 512), (640, 480), (1024, 1024), (2400, 1080)])


@settings(max_examples=200, deadline=None)
@given(st.integers(0, 2**32 - 1), st.integers(1, 600), st.integers(1, 60), st.booleans())
def test_two_halves_joined_equal_one_pass(seed, n, m, same_size):
    rng = np.random.default_rng(seed)
    ids = rng.integers(0, m, n)
    sizes = rng.integers(1, 9, m)[ids] if same_size else rng.integers(1, 9, n)
    want = required_capacities(ids, sizes, m, compiled=False)
    for parts in (1, 2):
        got = required_capacities(ids, sizes, m, compiled=True, parts=parts)
        assert all(np.array_equal(a, b) for a, b in zip(got, want))


@settings(max_examples=200, deadline=None)
@given(st.integers(0, 2**32 - 1), st.integers(2, 60), st.integers(1, 15))
def test_bounds_of_two_halves_joined_equal_one_pass(seed, rows, m):
    """Insert at completion one request at a time: the recency pass over each half of the
    requests, joined, gives every reference's bounds, previous and next reference."""
    rng = np.random.default_rng(seed)
    lens = rng.integers(0, 5, rows)
    ids = rng.integers(0, m, int(lens.sum()))
    row_start = np.r_[0, np.cumsum(lens)].astype(np.int64)
    w = rng.integers(1, 9, m)
    old = kernels.PYTHON_MAX_REFS
    try:
        kernels.PYTHON_MAX_REFS = 1 << 40
        want = S.bounds(ids, row_start, w, parts=1)  # plain Python, one pass
        kernels.PYTHON_MAX_REFS = -1
        got = S.bounds(ids, row_start, w, parts=2)
    finally:
        kernels.PYTHON_MAX_REFS = old
    assert all(np.array_equal(a, b) for a, b in zip(got, want))


@settings(max_examples=100, deadline=None)
@given(st.lists(st.integers(-3, 40), max_size=300), st.booleans())
def test_first_ids_number_keys_in_order_of_first_appearance(keys, compiled):
    keys = np.array(keys, np.int64) * 7919 - 5
    old = kernels.PYTHON_MAX_REFS
    kernels.PYTHON_MAX_REFS = -1 if compiled else 1 << 40
    try:
        ids, first = first_ids(keys)
    finally:
        kernels.PYTHON_MAX_REFS = old
    order = list(dict.fromkeys(keys.tolist()))
    assert ids.tolist() == [order.index(k) for k in keys.tolist()]
    assert keys[first].tolist() == order


def _trace(seed: int, refs: int, objects: int) -> Trace:
    rng = np.random.default_rng(seed)
    p = 1.0 / np.arange(1, objects + 1) ** rng.uniform(0.5, 1.2)
    ids = rng.choice(objects, size=refs, p=p / p.sum()).astype(np.int64)
    lens = rng.integers(1, 4, size=refs)
    lens = lens[np.cumsum(lens) <= refs]
    lens = np.r_[lens, refs - lens.sum()] if lens.sum() < refs else lens
    dims = DIMS[rng.integers(0, len(DIMS), size=objects)]
    return Trace(ids, np.repeat(np.arange(lens.size), lens), int(lens.size),
                 dims[:, 0].copy(), dims[:, 1].copy())


def _analysis(trace: Trace, name: str, threads: int, monkeypatch, in_flight: int = 1) -> tuple:
    model = get_model("qwen3-vl-30b-a3b")
    monkeypatch.setattr(kernels, "PYTHON_MAX_REFS", -1)  # compiled kernels, short traces
    monkeypatch.setattr(kernels, "threads", lambda refs: threads)
    sizes, _ = trace.costs(model, target=get_target(name))
    total = int(sizes[np.unique(trace.ids)].sum())
    caps = [max(1, int(total * f)) for f in (0.01, 0.05, 0.2, 0.7)]
    images = [1, 3, 40] if get_target(name).entry != "embedding-set" else []
    a = analyze(trace, model, Semantics(target=name, in_flight=in_flight), cache_bytes=caps,
                cache_images=images)
    return a.summary, {k: v.tolist() for k, v in a.curve.columns().items()}, \
        a.curve.capacity.tolist()


@pytest.mark.parametrize("name", target_names())
@pytest.mark.parametrize("seed", [0, 1, 2])
def test_analysis_on_threads_equals_one_thread(name, seed, monkeypatch):
    trace = _trace(seed, 3000, 40 + 60 * seed)
    one = _analysis(trace, name, 1, monkeypatch)
    assert _analysis(trace, name, 2, monkeypatch) == one
    assert _analysis(trace, name, 3, monkeypatch) == one


def test_events_replays_on_threads_equal_one_thread(monkeypatch):
    """Insert at completion with requests in flight: the general replay dealt over threads."""
    trace = _trace(7, 2000, 80)
    one = _analysis(trace, "dynamo-encode", 1, monkeypatch, in_flight=4)
    assert _analysis(trace, "dynamo-encode", 2, monkeypatch, in_flight=4) == one
