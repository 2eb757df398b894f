"""The seed arithmetic of vision-caches.md as fixed tests, from plans (no pixels).

The arithmetic is a byte LRU filled at lookup: Dynamo's embedding cache with nothing in front
of it (``PLAIN``: dynamo-encode registering at schedule; insert-at-completion cases use
dynamo-encode as it is). Dynamo's aggregated deployment puts vLLM's encoder cache in front:
``test_analysis_tiers``."""
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from mmdatagen.analysis import concurrency
from mmdatagen.analysis.predict import GIB, Semantics, analyze
from mmdatagen.analysis.trace import trace_from_plan
from mmdatagen.errors import UserError
from mmdatagen.plans import pool_plan, sliding_window_plan
from mmdatagen.vlm import get_model

QWEN3 = get_model("qwen3-vl-30b-a3b")
ENTRY = 10_444_800  # 2,550 tokens x 4,096 B for a 2400x1080 image


PLAIN = {"target": "dynamo-encode", "insert": "schedule"}


def _run(plan, caps_images=(), caps_gb=(), **sem):
    sem = {**PLAIN, **sem} if "insert" not in sem else {"target": "dynamo-encode", **sem}
    return analyze(trace_from_plan(plan), QWEN3, Semantics(**sem),
                   [int(g * GIB) for g in caps_gb], list(caps_images)).summary


def _rate(summary, i=0):
    return summary["capacities"][i]["hit_rate"]


def test_worked_token_values_and_entry_bytes():
    q25 = get_model("qwen2.5-vl-7b")
    for (w, h), t3, t25 in [((2400, 1080), 2550, 3354), ((512, 512), 256, 324),
                            ((640, 480), 300, 391), ((5000, 5000), 16384, 16129)]:
        assert QWEN3.image_tokens(w, h) == t3 and q25.image_tokens(w, h) == t25
    assert QWEN3.entry_bytes(2400, 1080) == ENTRY
    assert QWEN3.entry_bytes(2400, 1080, real_width=True) == 4 * ENTRY
    assert 10 * GIB // ENTRY == 1028


def test_pool_bound_is_80_percent_and_needs_the_whole_pool():
    s = _run(pool_plan(), caps_images=[200, 199, 100])
    assert s["references"] == 1000 and s["distinct_images"] == 200
    assert s["compulsory_misses"] == 200 and s["best"]["hit_rate"] == pytest.approx(0.8)
    assert _rate(s, 0) == pytest.approx(0.8)
    assert _rate(s, 1) < 0.8
    assert _rate(s, 2) == pytest.approx(0.8 * 100 / 200, abs=0.06)  # about 0.8 C / 200
    assert s["thresholds"][-1]["capacity_images"] == 200


def test_sliding_window_cliff_at_149_entries_turn_major():
    s = _run(sliding_window_plan(), caps_images=[148, 149])
    assert s["references"] == 1200 and s["distinct_images"] == 360
    assert s["best"]["hits"] == 840 and s["best"]["hit_rate"] == pytest.approx(0.7)
    assert _rate(s, 0) == 0.0 and _rate(s, 1) == pytest.approx(0.7)
    assert [t["capacity_images"] for t in s["thresholds"]] == [149, 149, 149]
    # in bytes: 149 entries of 2400x1080 for Qwen3-VL-30B-A3B
    assert s["thresholds"][-1]["capacity_bytes"] == 149 * ENTRY


def test_sliding_window_bytes_cliff():
    s = _run(sliding_window_plan(), caps_gb=[148 * ENTRY / GIB, 149 * ENTRY / GIB])
    assert _rate(s, 0) == 0.0 and _rate(s, 1) == pytest.approx(0.7)


def test_user_major_needs_four_entries():
    s = _run(sliding_window_plan(order="user-major"), caps_images=[3, 4])
    assert _rate(s, 0) == 0.0 and _rate(s, 1) == pytest.approx(0.7)


def test_insert_at_completion_64_in_flight_turn_major():
    # FIFO completion: a reuse 30 or 60 rows later is still in flight; from 90 rows on it hits.
    # Per user image j appears in n_j consecutive turns, hits = sum(max(0, n_j - 3)) = 10 of 40.
    s = _run(sliding_window_plan(), caps_images=[360], insert="completion", in_flight=64)
    assert _rate(s) == pytest.approx(0.25)
    assert 0.2 < s["best"]["hit_rate"] < 0.45  # "drops to about a third" in the reference notes
    sched = _run(sliding_window_plan(), caps_images=[360], in_flight=64)
    assert _rate(sched) == pytest.approx(0.7)  # registered at schedule time: in-flight hits


def test_insert_at_completion_with_one_in_flight_equals_schedule_time():
    plan = pool_plan(reuse="uniform", pool_size=50, num_requests=300)
    caps = [5, 20, 50]
    a = _run(plan, caps_images=caps, insert="completion", in_flight=1)
    b = _run(plan, caps_images=caps)
    assert [c["hits"] for c in a["capacities"]] == [c["hits"] for c in b["capacities"]]


def test_causal_session_replay_makes_consecutive_turns_hit():
    # AIPerf session replay: a user's next turn waits for the previous one, so even with
    # insert-at-completion every shared image is present; 30 sessions in flight = turn-major.
    s = _run(sliding_window_plan(), caps_images=[149, 148], insert="completion", in_flight=30,
             dispatch="sessions")
    assert _rate(s, 0) == pytest.approx(0.7) and _rate(s, 1) < 0.7
    one = _run(sliding_window_plan(), caps_images=[4], dispatch="sessions", in_flight=1)
    assert _rate(one) == pytest.approx(0.7)  # one session at a time = user-major


@settings(max_examples=100, deadline=None)
@given(st.lists(st.integers(0, 6), min_size=1, max_size=40), st.integers(1, 5))
def test_session_events_are_causal_and_bounded(sessions, k):
    sessions = np.array(sessions)
    ev = concurrency.events(sessions.size, k, sessions, "sessions")
    done, running = set(), set()
    for e in ev.tolist():
        if e >= 0:
            assert all(p in done for p in range(e) if sessions[p] == sessions[e])  # causal
            running.add(e)
            assert len(running) <= k  # one request per session, at most k sessions
            assert len({sessions[r] for r in running}) == len(running)
        else:
            assert ~e in running
            running.discard(~e)
            done.add(~e)
    assert sorted(done) == list(range(sessions.size)) and not running
    order = concurrency.dispatch_order(ev).tolist()
    assert sorted(order) == list(range(sessions.size))
    firsts = [order.index(int(np.flatnonzero(sessions == s)[0])) for s in dict.fromkeys(sessions)]
    assert firsts == sorted(firsts)  # sessions start in order of first appearance


def test_file_events_keep_k_in_flight():
    ev = concurrency.events(5, 2).tolist()
    assert ev == [0, 1, ~0, 2, ~1, 3, ~2, 4, ~3, ~4]


def test_bad_semantics_are_user_errors():
    with pytest.raises(UserError):
        concurrency.events(3, 0)
    with pytest.raises(UserError):
        _run(pool_plan(num_requests=10, pool_size=5), insert="later")
