"""The dispatch core (``mmdatagen/scheduling.py``): one strategy of sessions, phases, arrivals and
concurrency, driven by the loader (real time), ``simulate`` (virtual time) and the analysis
(completion order only).

The loader, ``simulate`` and the analysis used to carry a dispatch model each, kept in line by
agreement tests; these are now unit tests of the one core, driven here by small clocks, plus
checks that each driver is the core (the analysis's closed forms, simulate's and the loader's
sequences)."""
from __future__ import annotations

import asyncio
import time
from collections import deque
from pathlib import Path

import numpy as np
import orjson
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from mmdatagen.analysis.concurrency import events
from mmdatagen.arrivals import Pacer
from mmdatagen.scheduling import (
    DONE,
    HOLD,
    PROFILING,
    RATE_DEFAULT_CAP,
    SEND,
    WAIT,
    WARMUP,
    Core,
    Phase,
    phases,
    slots_for,
)
from mmdatagen.sessions import Replay, group_rows


def _core(groups, run_phases, wrap=False) -> Core:
    return Core(Replay(groups, wrap=wrap), run_phases)


def _completion_order(core: Core, k: int, pick, swap: bool) -> list[int]:
    """Drive ``core`` with ``k`` slots by completion order alone (``pick(running)``: the index
    of the request that completes next, removed by swapping the last one in when ``swap``);
    events as in ``analysis.concurrency``: ``r`` dispatched, ``~r`` completed."""
    out: list[int] = []
    running: list = []

    def ask(slot) -> None:
        if core.next(slot, 0.0) == SEND:
            running.append((slot.turn, slot))
            out.append(slot.turn)

    for _ in range(k):
        ask(core.add_slot())
    while running:
        j = pick(running)
        row, slot = running[j]
        if swap:
            running[j] = running[-1]
            running.pop()
        else:
            del running[j]
        out.append(~row)
        core.complete(slot, 0.0)
        ask(slot)
    return out


@settings(max_examples=40, deadline=None)
@given(n=st.integers(0, 60), k=st.integers(1, 9), seed=st.integers(0, 2**31))
def test_file_order_closed_forms_are_the_core(n, k, seed):
    """``--dispatch file``: every row a session of its own; the analysis's first-in first-out
    closed form and its compiled random-completion loop are the core's order."""
    rows = [[r] for r in range(n)]
    fifo = _completion_order(_core(rows, [Phase(PROFILING)]), k, lambda running: 0, swap=False)
    assert events(n, k).tolist() == fifo
    draws = np.random.default_rng(seed).integers(0, 1 << 62, size=max(n, 1))
    d = iter(draws.tolist())
    want = _completion_order(_core(rows, [Phase(PROFILING)]), k,
                             lambda running: next(d) % len(running), swap=True)
    assert events(n, k, None, "file", seed).tolist() == want


def _oracle(groups: list[list[int]], k: int) -> list[int]:
    """An independent model of causal session replay, first-in first-out completion."""
    out: list[int] = []
    waiting, pos = deque(range(len(groups))), [0] * len(groups)
    running: deque = deque()

    def start(g: int) -> None:
        running.append((groups[g][pos[g]], g))
        out.append(groups[g][pos[g]])
        pos[g] += 1

    while waiting and len(running) < k:
        start(waiting.popleft())
    while running:
        row, g = running.popleft()
        out.append(~row)
        if pos[g] < len(groups[g]):
            start(g)
        elif waiting:
            start(waiting.popleft())
    return out


session_column = st.lists(st.integers(0, 7), min_size=0, max_size=40)


@settings(max_examples=60, deadline=None)
@given(column=session_column, k=st.integers(1, 6), seed=st.integers(0, 1000))
def test_sessions_replay_causally_with_k_slots(column, k, seed):
    """Sessions start in first-appearance order, at most ``k`` at a time; a session's next row
    starts only after its previous one completed, on the same slot; a freed slot starts the
    next session at once. Checked against an independent model (first-in first-out) and as
    invariants (seeded random completion), and ``analyze --dispatch sessions`` is the core."""
    groups = group_rows(column)
    ids = np.array(column, np.int64)
    fifo = events(len(column), k, ids, "sessions") if column else np.array([], np.int64)
    assert fifo.tolist() == _oracle(groups, k)
    ev = events(len(column), k, ids, "sessions", seed) if column else np.array([], np.int64)
    session_of = {r: g for g, rows in enumerate(groups) for r in rows}
    done: set[int] = set()
    active: dict[int, int] = {}  # session -> rows in flight
    started: list[int] = []
    for e in ev.tolist():
        if e >= 0:
            g = session_of[e]
            before = [r for r in groups[g] if r < e]
            assert set(before) <= done  # causal: the earlier rows have completed
            if g not in active:
                started.append(g)
            active[g] = active.get(g, 0) + 1
            assert active[g] == 1 and len(active) <= k
        else:
            g = session_of[~e]
            done.add(~e)
            active[g] -= 1
            if all(r in done for r in groups[g]):
                del active[g]
    assert started == list(range(len(groups))) and done == set(range(len(column)))


def _timed(core: Core, k: int, duration, limit: float = 1e9) -> list[tuple]:
    """A virtual clock: each request takes ``duration(row)``; a paced slot waits for its ticket.
    Returns (start time, phase, row) of every request sent."""
    import heapq

    slots = [core.add_slot() for _ in range(k)]
    due = [(0.0, i) for i in range(k)]
    done: list = []
    sent: list[tuple] = []
    while due or done:
        t, kind, i = min([(d[0], 1, d[1]) for d in due[:1]] + [(d[0], 0, d[2]) for d in done[:1]])
        if t > limit:
            break
        if kind == 0:  # a completion first at equal times
            heapq.heappop(done)
            core.complete(slots[i], t)
            heapq.heappush(due, (t, i))
            due.extend((t, s.index) for s in core.released)
            core.released.clear()
            heapq.heapify(due)
            continue
        heapq.heappop(due)
        step = core.next(slots[i], t)
        if step == SEND:
            sent.append((round(t, 9), slots[i].phase, slots[i].turn))
            heapq.heappush(done, (t + duration(slots[i].turn), len(sent), i))
        elif step == WAIT:
            heapq.heappush(due, (slots[i].at, i))
    return sent


def test_warmup_drains_before_profiling_and_sessions_continue():
    groups = [[0, 1, 2], [3, 4], [5], [6, 7]]
    core = _core(groups, phases(3, 4))
    sent = _timed(core, 2, lambda row: 1.0 + row / 10)
    assert [p for _, p, _ in sent] == [WARMUP] * 3 + [PROFILING] * 4
    warm_end = max(t + 1.0 + r / 10 for t, p, r in sent if p == WARMUP)
    assert min(t for t, p, _ in sent if p == PROFILING) == pytest.approx(warm_end)
    rows = [r for _, _, r in sent]
    assert rows == [0, 3, 1, 2, 4, 5, 6]  # sessions 0 and 1 continue across the barrier
    assert core.finished()


def test_a_held_slot_waits_for_the_barrier_and_slots_resume_in_order():
    core = _core([[0], [1], [2], [3]], phases(2, 2))
    a, b, c = core.add_slot(), core.add_slot(), core.add_slot()
    assert core.next(a, 0.0) == SEND and core.next(b, 0.0) == SEND
    assert core.next(c, 0.0) == HOLD  # warmup's count is used, two in flight
    core.complete(b, 1.0)
    assert core.next(b, 1.0) == HOLD and core.released == []
    core.complete(a, 2.0)
    assert [s.index for s in core.released] == [1, 2]  # slot order
    assert core.phase.name == PROFILING and core.phase.started == 2.0


def test_a_paced_phase_sends_on_the_pacer_slots_and_the_cap_holds():
    """Short requests: every start is the pacer's slot; long ones: the cap delays starts, and
    a ticket taken early still counts against the request count."""
    rows = [[r] for r in range(12)]
    quick = _timed(_core(rows, [Phase(PROFILING, 12, Pacer(10.0, "constant"))]), 3,
                   lambda _: 0.05)
    assert [t for t, _, _ in quick] == pytest.approx([i / 10 for i in range(12)])
    slow = _timed(_core(rows, [Phase(PROFILING, 8, Pacer(10.0, "constant"))]), 2,
                  lambda _: 1.0)
    assert len(slow) == 8
    assert [t for t, _, _ in slow][:4] == pytest.approx([0.0, 0.1, 1.0, 1.1])


def test_poisson_tickets_follow_the_seeded_schedule():
    rows = [[r] for r in range(30)]
    sent = _timed(_core(rows, [Phase(PROFILING, 30, Pacer(40.0, "poisson", seed=4))]), 64,
                  lambda _: 0.01)
    ref = Pacer(40.0, "poisson", seed=4)
    assert [t for t, _, _ in sent] == pytest.approx([ref.take(0.0) for _ in range(30)])


def test_duration_stops_the_run_and_stop_ends_every_slot():
    rows = [[r] for r in range(100)]
    core = _core(rows, [Phase(PROFILING, None, Pacer(8.0, "constant"), duration=1.0)])
    sent = _timed(core, 4, lambda _: 0.01)
    assert len(sent) == 8 and sent[-1][0] == 0.875 and core.stopped  # the ninth is due at 1.0
    other = _core(rows, [Phase(PROFILING)])
    slot = other.add_slot()
    assert other.next(slot, 0.0) == SEND
    other.stop()
    other.complete(slot, 0.1)
    assert other.next(slot, 0.1) == DONE and other.finished()


def test_exhausted_data_opens_profiling_and_retires_every_slot():
    core = _core([[0, 1], [2]], phases(10, None))
    sent = _timed(core, 3, lambda _: 1.0)
    assert [(p, r) for _, p, r in sent] == [(WARMUP, 0), (WARMUP, 2), (WARMUP, 1)]
    assert core.phase.name == PROFILING and core.finished()
    assert all(s.retired for s in core.slots)


def test_wrapping_passes_label_epochs_and_count_limits():
    core = _core([["a0", "a1"], ["b0"]], [Phase(PROFILING, 7)], wrap=True)
    sent = _timed(core, 1, lambda _: 1.0)
    assert [r for _, _, r in sent] == ["a0", "a1", "b0", "a0", "a1", "b0", "a0"]
    assert core.finished()


# -- the drivers are the core -------------------------------------------------------------------

def _dataset(folder: Path) -> Path:
    rows = []
    for i, sid in enumerate(["A", "B", None, "A", "C", "B", None, "A", "C", "D"]):
        rows.append({"text": f"row {i}", **({} if sid is None else {"session_id": sid})})
    path = folder / "d.jsonl"
    path.write_bytes(b"".join(orjson.dumps(r) + b"\n" for r in rows))
    return path


def _loader_sequence(path: Path, warmup: int, count: int, concurrency: int) -> list[tuple]:
    """The loader's own driver (workers, ``Scheduler``, ``SessionSource``) with an instant
    in-process client: (phase, session, text) in start order."""
    from mmdatagen.io.readers import iter_turns
    from mmdatagen.loadgen.client import Result
    from mmdatagen.loadgen.dispatch import Context, Scheduler, worker
    from mmdatagen.loadgen.payload import BodyConfig, ImageEncoder
    from mmdatagen.loadgen.sessions import SessionSource

    class Client:
        async def request(self, path, payload, headers, streaming, collect_text):
            t = time.perf_counter_ns()
            await asyncio.sleep(0)
            return Result(start_ns=t, end_ns=t + 1, first_ns=t, status=200)

    async def go() -> list:
        src = SessionSource(lambda: iter_turns(path, "single_turn"), "single_turn", wrap=True)
        ctx = Context(client=Client(), path="/v1/chat/completions",
                      body_cfg=BodyConfig(model="m"), encoder=ImageEncoder(path.parent),
                      source=src, sched=Scheduler(warmup=warmup, count=count))
        await asyncio.gather(*(worker(ctx) for _ in range(concurrency)))
        return ctx.records

    records = asyncio.run(go())
    return [(r.phase, r.conversation_id) for r in sorted(records, key=lambda r: r.dispatch_index)]


def test_loader_and_simulate_send_the_same_sequence(tmp_path):
    """One slot: the loader's real-time driver and simulate's virtual driver send the same
    sessions in the same phases, wrapping into a second pass."""
    from mmdatagen.sim.profile import load_profile
    from mmdatagen.sim.virtual import OutputPolicy, load_turns, simulate

    path = _dataset(tmp_path)
    prof = load_profile("zero-delay")
    res = simulate(load_turns(path, prof), prof, 0.0, 1, 12, 4, OutputPolicy(2, 2, True))
    virtual = [(r.phase, r.conversation_id) for r in sorted(res.records, key=lambda r: r.start_ns)]
    loader = _loader_sequence(path, 4, 12, 1)
    assert loader == virtual
    assert [p for p, _ in loader] == [WARMUP] * 4 + [PROFILING] * 12
    assert loader[10] == (PROFILING, "A#1")  # ten rows in a pass: the second pass's first


def test_loader_concurrency_counts_sessions(tmp_path):
    """Three slots over four sessions and two lone rows: one pass sends every row once."""
    path = _dataset(tmp_path)
    seq = _loader_sequence(path, 0, 10, 3)
    by_session: dict[str, int] = {}
    for _, sid in seq:
        by_session[sid] = by_session.get(sid, 0) + 1
    assert by_session == {"A": 3, "B": 2, "row_3": 1, "C": 2, "row_7": 1, "D": 1}


def test_sweep_virtual_predicts_in_the_cores_order(tmp_path, run_cli):
    """8 sessions of 5 turns written turn-major, each alternating two images of its own: the
    core replays a session at a time, so with one slot the cache holds a session's two images
    and 24 of 40 lookups hit. The virtual sweep's prediction follows the same order (file
    order, 16 images cycling through a smaller cache, predicted none) and equals the run."""
    import base64
    import io

    from PIL import Image

    urls = []
    for i in range(16):
        buf = io.BytesIO()
        Image.new("RGB", (32, 32), (15 * i, 10, 200)).save(buf, format="PNG")
        urls.append("data:image/png;base64," + base64.b64encode(buf.getvalue()).decode())
    rows = [{"text": f"q {s} {turn}", "session_id": f"s{s}", "image": urls[2 * s + turn % 2]}
            for turn in range(5) for s in range(8)]
    data = tmp_path / "d.jsonl"
    data.write_bytes(b"".join(orjson.dumps(r) + b"\n" for r in rows))
    out = tmp_path / "sw"
    res = run_cli("sweep", "--input-file", data, "--virtual", "--concurrency", "1,4",
                  "--cache-size", "0.001", "--repeats", "1", "--extra-inputs", "max_tokens:4",
                  "--sim-param", "encoder_budget=64", "--output-dir", out, "--no-report")
    assert res.exit_code == 0, res.output
    for c, hits in ((1, 24), (4, 0)):
        [export] = out.glob(f"concurrency-{c}_*/r1/profile_export_mmdatagen.json")
        cache = orjson.loads(export.read_bytes())["image_cache"]
        assert cache["measured"]["hits"] == cache["predicted"]["hits"] == hits
        assert cache["predicted"]["references"] == 40
        assert f"--in-flight {c}" in cache["predicted"]["order"]


@pytest.mark.parametrize("concurrency,rate,slots", [
    (4, None, 4), (4, 10.0, 4), (None, None, 1), (None, 10.0, RATE_DEFAULT_CAP)])
def test_every_driver_takes_its_slots_from_the_core(concurrency, rate, slots, monkeypatch):
    """One rule for the slots (the loader, ``simulate``, ``sweep --virtual``, calibrate's
    replay): a change to the core's cap reaches each of them."""
    from mmdatagen.loadgen import run as loader
    from mmdatagen.loadgen import sweep
    from mmdatagen.sim import calibrate, study

    assert slots_for(concurrency, rate) == slots
    for user in (loader, sweep, study):
        assert user.slots_for is slots_for  # imported, not redefined
    assert "slots_for" in calibrate.replay.__code__.co_names
