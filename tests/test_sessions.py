"""Session order is one rule (mmdatagen/sessions.py): the loader, simulate and the analysis's
causal concurrency model start the same sessions in the same order with the same turns."""
from __future__ import annotations

import tempfile
from pathlib import Path

import numpy as np
import orjson
from hypothesis import given, settings
from hypothesis import strategies as st

from mmdatagen.analysis.concurrency import session_rows
from mmdatagen.analysis.trace import trace_from_dataset
from mmdatagen.io.readers import iter_turns
from mmdatagen.loadgen.sessions import SessionSource
from mmdatagen.sessions import Cycle, group_ids, group_rows, row_key
from mmdatagen.sim.profile import load_profile
from mmdatagen.sim.virtual import load_turns, session_feed, session_label

PROFILE = load_profile("zero-delay")
session_ids = st.lists(st.one_of(st.none(), st.sampled_from(["a", "b", "c", "d", "row_2"])),
                       min_size=1, max_size=25)


def _write(folder: Path, column: list[str | None]) -> Path:
    path = folder / "d.jsonl"
    rows = [{"text": f"r{i}", **({} if sid is None else {"session_id": sid})}
            for i, sid in enumerate(column)]
    path.write_bytes(b"".join(orjson.dumps(r) + b"\n" for r in rows))
    return path


def _loader(path: Path, passes: int = 1) -> list[tuple[str, list[int]]]:
    """(label, rows) of each session the loader starts, its turns drained (one slot)."""
    src = SessionSource(lambda: iter_turns(path, "single_turn"), "single_turn", wrap=passes > 1)
    out = []
    while (sess := src.next_session()) is not None:
        rows = []
        while (turn := src.next_turn(sess)) is not None:
            rows.append(int(turn.texts[0][1:]))
        out.append((sess.conversation_id, rows))
        if src.passes > passes:
            return out[:-1]
    return out


def _simulate(path: Path, sessions: int | None = None) -> list[tuple[str, list[int]]]:
    turns = load_turns(path, PROFILE)
    row_of = {id(t): i for i, t in enumerate(turns)}
    feed = session_feed(turns, wrap=sessions is not None)
    out = []
    while (sessions is None or len(out) < sessions) and (nxt := feed.next_session()) is not None:
        out.append((session_label(nxt), [row_of[id(t)] for t in nxt.rows]))
    return out


def _analysis(path: Path) -> list[list[int]]:
    trace = trace_from_dataset(path)
    if trace.sessions is None:  # no session ids: every row alone, in file order
        return [[r] for r in range(trace.num_rows)]
    return [g.tolist() for g in session_rows(trace.sessions)]


@settings(max_examples=60, deadline=None)
@given(session_ids)
def test_loader_simulate_and_analysis_start_the_same_sessions(column):
    with tempfile.TemporaryDirectory() as tmp:
        path = _write(Path(tmp), column)
        loader, virtual, analysis = _loader(path), _simulate(path), _analysis(path)
    expected = group_rows(row_key(sid, i + 1) for i, sid in enumerate(column))
    assert [rows for _, rows in loader] == expected
    assert virtual == loader  # the same labels too
    assert analysis == expected
    assert [label for label, _ in loader] == [
        column[rows[0]] if column[rows[0]] is not None else f"row_{rows[0] + 1}"
        for rows in expected]


@settings(max_examples=30, deadline=None)
@given(session_ids)
def test_wrapped_passes_have_the_same_labels(column):
    with tempfile.TemporaryDirectory() as tmp:
        path = _write(Path(tmp), column)
        loader = _loader(path, passes=3)
        virtual = _simulate(path, len(loader))
    assert virtual == loader
    first = len(group_rows(row_key(sid, i) for i, sid in enumerate(column)))
    assert len(loader) == 3 * first
    assert all(label.endswith("#2") for label, _ in loader[2 * first:])


@given(st.lists(st.integers(0, 6), max_size=40))
def test_the_vectorised_grouping_is_the_same_rule(ids):
    assert [g.tolist() for g in group_ids(np.array(ids, np.int64))] == group_rows(ids)


def test_multi_turn_lines_are_sessions_even_with_one_id(tmp_path):
    """Two multi_turn lines with the same session_id are two sessions for both consumers."""
    path = tmp_path / "m.jsonl"
    line = {"session_id": "s", "turns": [{"text": "a"}, {"text": "b"}]}
    path.write_bytes(orjson.dumps(line) + b"\n" + orjson.dumps(line) + b"\n")
    src = SessionSource(lambda: iter_turns(path, "multi_turn"), "multi_turn")
    loader = []
    while (sess := src.next_session()) is not None:
        loader.append((sess.conversation_id, len(list(iter(lambda: src.next_turn(sess), None)))))
    turns = load_turns(path, PROFILE)
    virtual = [(session_label(s), len(s.rows))
               for s in iter(session_feed(turns, wrap=False).next_session, None)]
    assert loader == virtual == [("s", 2), ("s", 2)]
    assert turns[2].text_tokens == turns[0].text_tokens < turns[1].text_tokens  # own history


def test_cycle_stops_after_one_pass_without_wrap():
    c = Cycle(2, wrap=False)
    assert [c.take(), c.take(), c.take()] == [(0, 0), (1, 0), None]
    w = Cycle(2)
    assert [w.take() for _ in range(5)] == [(0, 0), (1, 0), (0, 1), (1, 1), (0, 2)]
    assert Cycle(0).take() is None
