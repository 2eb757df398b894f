"""Every target's fast curve equals an exact replay of the shared cache model (the simulator's
implementation), on random traces with multi-image rows, repeats inside rows and varied sizes."""
from __future__ import annotations

from dataclasses import replace

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from mmdatagen.analysis.targets import (
    Replay,
    fifo_flags,
    request_span,
    set_curve,
    touch_required,
)
from mmdatagen.analysis.trace import Trace
from mmdatagen.caches import get_target


@st.composite
def traces(draw):
    m = draw(st.integers(1, 12))
    sizes = np.array(draw(st.lists(st.integers(1, 9), min_size=m, max_size=m)), np.int64)
    rows = draw(st.lists(st.lists(st.integers(0, m - 1), min_size=0, max_size=4),
                         min_size=1, max_size=40))
    lens = np.array([len(r) for r in rows], np.int64)
    ids = np.array([x for r in rows for x in r], np.int64)
    trace = Trace(ids, np.repeat(np.arange(len(rows)), lens), len(rows),
                  np.ones(m, np.int64), np.ones(m, np.int64))
    return trace, sizes


def _hits_at(req: np.ndarray, cap: int) -> np.ndarray:
    return (req >= 0) & (req <= cap)


@settings(max_examples=300, deadline=None)
@given(traces(), st.integers(0, 60))
def test_touch_first_lru_stack_distance_at_request_start(tr, cap):
    trace, sizes = tr
    exact = Replay(get_target("vllm-processor"), trace, sizes).flags(cap)
    if cap >= request_span(trace, sizes):
        assert np.array_equal(_hits_at(touch_required(trace, sizes), cap), exact)


@settings(max_examples=300, deadline=None)
@given(traces(), st.integers(0, 60))
def test_fifo_kernel_matches_the_model(tr, cap):
    trace, sizes = tr
    exact = Replay(get_target("vllm-processor-shm"), trace, sizes).flags(cap)
    assert np.array_equal(fifo_flags(trace, sizes, cap), exact)


@settings(max_examples=300, deadline=None)
@given(traces(), st.integers(0, 80))
def test_set_keyed_curve_matches_the_model(tr, cap):
    trace, sizes = tr
    exact = Replay(get_target("sglang-vlm"), trace, sizes).flags(cap)
    curve = set_curve(trace, sizes, sizes)
    assert curve.at([cap])["hits"][0] == exact.sum()


def test_touch_first_differs_from_plain_lru_where_vllm_does():
    """Request [b, a] with a cached: plain LRU lets b's insert evict a first; vLLM's touch keeps
    a (it is refreshed before b is inserted)."""
    ids = np.array([0, 2, 1, 0], np.int64)  # row0: a ; row1: c ; row2: b, a
    trace = Trace(ids, np.array([0, 1, 2, 2]), 3, np.ones(3, np.int64), np.ones(3, np.int64))
    sizes = np.array([4, 4, 4], np.int64)
    exact = Replay(get_target("vllm-processor"), trace, sizes).flags(8)
    plain = Replay(replace(get_target("dynamo-encode"), present="schedule"), trace,
                   sizes).flags(8)  # a byte LRU filled at lookup, nothing touched first
    assert exact.tolist() == [False, False, False, True]
    assert plain.tolist() == [False, False, False, False]
    assert _hits_at(touch_required(trace, sizes), 8).tolist() == exact.tolist()


@settings(max_examples=300, deadline=None)
@given(traces(), st.integers(0, 60))
def test_encoder_cache_is_an_lru_by_release_from_the_request_span_up(tr, cap):
    """vLLM's encoder cache at one request in flight (pinned while in use, released in input
    order with a repeat at its last occurrence, freeable evicted oldest first) equals a token
    LRU whenever a request's distinct items fit together."""
    from mmdatagen.analysis.lru import required_capacity

    trace, sizes = tr
    exact = Replay(get_target("vllm-encoder"), trace, sizes).flags(cap)
    if cap >= request_span(trace, sizes):
        req = required_capacity(trace.ids, sizes[trace.ids], sizes.size)
        assert np.array_equal(_hits_at(req, cap), exact)


def test_encoder_cache_releases_a_repeat_at_its_last_occurrence():
    """Request [a, b, a]: vLLM frees a only with its last input, so b is older on the freeable
    list and is the one a later miss evicts."""
    ids = np.array([0, 1, 0, 2, 0], np.int64)  # row0: a b a ; row1: c ; row2: a
    trace = Trace(ids, np.array([0, 0, 0, 1, 2]), 3, np.ones(3, np.int64), np.ones(3, np.int64))
    sizes = np.array([4, 4, 4], np.int64)
    assert Replay(get_target("vllm-encoder"), trace, sizes).flags(8).tolist() == [
        False, False, True, False, True]
