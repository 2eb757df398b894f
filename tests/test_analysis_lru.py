"""The one-pass LRU curve against a plain OrderedDict replay, at every capacity."""
import numpy as np
import pytest
from analysis_oracle import completion_hits, replay_lru
from hypothesis import given, settings
from hypothesis import strategies as st

from mmdatagen.analysis import lru_curve, lru_hits, required_capacity
from mmdatagen.analysis.lru import dense_ids
from mmdatagen.errors import UserError

traces = st.integers(1, 12).flatmap(lambda m: st.tuples(
    st.lists(st.integers(0, m - 1), min_size=1, max_size=80),
    st.lists(st.integers(1, 9), min_size=m, max_size=m)))


def _rows(n, cuts):
    row = np.zeros(n, np.int64)
    for c in cuts:
        if c < n:
            row[c:] += 1
    return row


@settings(max_examples=150, deadline=None)
@given(traces, st.sampled_from(["bypass", "flush"]), st.lists(st.integers(1, 79), max_size=20))
def test_curve_equals_replay_at_every_capacity(trace, oversize, cuts):
    keys, obj = trace
    keys, obj = np.array(keys), np.array(obj)
    rows = _rows(keys.size, cuts)
    curve = lru_curve(keys, obj, obj_tokens=obj * 7, ref_row=rows, oversize=oversize)
    caps = list(range(0, int(obj.sum()) + 3))
    got = curve.at(caps)
    for i, cap in enumerate(caps):
        hit = np.array(replay_lru(keys.tolist(), obj[keys].tolist(), cap, oversize))
        assert got["hits"][i] == hit.sum()
        assert got["hit_bytes"][i] == obj[keys][hit].sum()
        assert got["hit_tokens"][i] == 7 * obj[keys][hit].sum()
        full = sum(bool(hit[rows == r].all()) for r in np.unique(rows))
        assert got["full_requests"][i] == full


@settings(max_examples=150, deadline=None)
@given(traces, st.sampled_from(["bypass", "flush"]), st.integers(0, 40))
def test_lru_hits_equals_replay(trace, oversize, cap):
    keys, obj = trace
    labels = [f"img{k}" for k in keys]  # arbitrary hashables
    sizes = [obj[k] for k in keys]
    expected = replay_lru(labels, sizes, cap, oversize)
    assert lru_hits(labels, sizes, cap, oversize).tolist() == expected
    assert lru_hits(np.array(keys) * 1_000_003, sizes, cap, oversize).tolist() == expected


def test_python_and_compiled_kernels_agree_with_compaction():
    rng = np.random.default_rng(3)
    ids = rng.zipf(1.3, 20_000) % 500
    sizes = (ids % 7 + 1).astype(np.int64)
    a = required_capacity(ids, sizes, compiled=False)
    b = required_capacity(ids, sizes, compiled=True)
    assert np.array_equal(a, b)
    assert (a[np.unique(ids, return_index=True)[1]] == -1).all()


def test_big_trace_curve_matches_replay_at_sampled_capacities():
    # longer than the Python-kernel threshold, so the compiled path is exercised end to end
    rng = np.random.default_rng(5)
    keys = rng.zipf(1.2, 60_000) % 3000
    obj = rng.choice([3, 5, 11], 3000)
    curve = lru_curve(keys, obj, oversize="bypass")
    for cap in (4, 10, 11, 200, 2500, 9000):
        assert curve.at([cap])["hits"][0] == sum(replay_lru(keys.tolist(), obj[keys].tolist(), cap))


def test_oversize_bypass_beats_flush_below_largest_object():
    keys = [0, 1, 0]          # 1 is huge: flushing evicts 0, bypass keeps it
    sizes = [1, 100, 1]
    assert lru_hits(keys, sizes, 10, "bypass").tolist() == [False, False, True]
    assert lru_hits(keys, sizes, 10, "flush").tolist() == [False, False, False]


def test_zero_size_entries_match_replay():
    keys, sizes = [0, 1, 0, 2, 0, 1], [0, 3, 0, 2, 0, 3]
    for cap in range(0, 7):
        for oversize in ("bypass", "flush"):
            assert lru_hits(keys, sizes, cap, oversize).tolist() == replay_lru(keys, sizes, cap,
                                                                               oversize)


def test_first_size_of_a_key_counts():
    assert lru_hits(["a", "b", "a"], [2, 2, 50], 4).tolist() == [False, False, True]


def test_bad_input_is_a_user_error():
    with pytest.raises(UserError):
        lru_hits([1, 2], [1], 5)
    with pytest.raises(UserError):
        lru_hits([1], [1], 5, oversize="drop")
    with pytest.raises(UserError):
        lru_hits([1, 2], [1, -4], 5)
    with pytest.raises(UserError):
        lru_curve(np.array([0, 1]), np.array([1, 0]))
    with pytest.raises(UserError):
        lru_curve(np.array([0, 1]), np.array([1, 1]), ref_row=np.array([1, 0]))


def test_dense_ids_keeps_small_ints_and_remaps_others():
    ids, m = dense_ids(np.array([5, 2, 5]))
    assert ids.tolist() == [5, 2, 5] and m == 6
    ids, m = dense_ids(np.array([10**12, -3, 10**12]))
    assert ids[0] == ids[2] != ids[1] and m == 2
    ids, m = dense_ids(["x", ("y", 1), "x"])
    assert ids.tolist() == [0, 1, 0] and m == 2


def test_curve_breakpoints_are_exactly_where_counts_change():
    curve = lru_curve(np.array([0, 1, 0, 1, 2, 0]), np.array([2, 3, 4]), oversize="flush")
    assert np.all(np.diff(curve.capacity) > 0)
    assert curve.capacity.tolist() == [5, 9]
    assert curve.hits.tolist() == [2, 3]


@pytest.mark.parametrize("compiled_size", [200, 40_000])
def test_bypass_tiers_window_and_fenwick_paths_agree(monkeypatch, compiled_size):
    from mmdatagen.analysis import lru

    rng = np.random.default_rng(compiled_size)
    keys = rng.zipf(1.1, compiled_size) % 300
    obj = rng.choice([2, 3, 7, 40, 41], 300)
    rows = np.sort(rng.integers(0, compiled_size // 2, compiled_size))
    window = lru_curve(keys, obj, obj_tokens=obj, ref_row=rows)
    monkeypatch.setattr(lru, "WINDOW_MAX_DEPTH", 0)
    fenwick = lru_curve(keys, obj, obj_tokens=obj, ref_row=rows)
    for name in ("capacity", "hits", "hit_bytes", "hit_tokens", "full_requests"):
        assert np.array_equal(getattr(window, name), getattr(fenwick, name)), name
    for cap in (2, 6, 9, 39, 45):
        assert window.at([cap])["hits"][0] == sum(replay_lru(keys.tolist(), obj[keys].tolist(), cap))


@settings(max_examples=80, deadline=None)
@given(traces, st.sampled_from(["bypass", "flush"]), st.integers(0, 40))
def test_insert_at_completion_with_one_in_flight_is_a_plain_lru(trace, oversize, cap):
    from mmdatagen.analysis import concurrency

    keys, obj = trace
    ev = concurrency.events(len(keys), 1)
    rows = [np.array([k]) for k in keys]
    got = completion_hits(ev, rows, np.array(obj), cap, oversize)
    assert [bool(h[0]) for h in got] == replay_lru(keys, [obj[k] for k in keys], cap, oversize)


@settings(max_examples=120, deadline=None)
@given(traces, st.sampled_from(["bypass", "flush"]), st.integers(0, 40), st.integers(1, 6),
       st.lists(st.integers(1, 79), max_size=30), st.booleans())
def test_completion_kernel_equals_ordereddict_events(trace, oversize, cap, k, cuts, compiled):
    from mmdatagen.analysis import concurrency

    keys, obj = trace
    ids, obj = np.array(keys, np.int64), np.array(obj, np.int64)
    rows = _rows(ids.size, cuts)
    num_rows = int(rows[-1]) + 1
    row_start = np.searchsorted(rows, np.arange(num_rows + 1))
    ev = concurrency.events(num_rows, k)
    refs = [ids[row_start[r]:row_start[r + 1]] for r in range(num_rows)]
    expected = np.concatenate(completion_hits(ev, refs, obj, cap, oversize))
    got = concurrency.completion_flags(ev, row_start, ids, obj, cap, oversize, compiled)
    assert got.tolist() == expected.tolist()
