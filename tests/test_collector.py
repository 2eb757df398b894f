"""The cycle collector while a benchmark's requests run (``lifecycle.rare_full_collections``):
a full collection pauses the event loop for longer the more objects live (45-65 ms at 40,000
requests here), so none may fall among the measured requests; young cycles are still
collected, and everything is as it was after the block."""
from __future__ import annotations

import gc
import time

from loadgen_helpers import Stub, bench_config, write_jsonl

from mmdatagen.lifecycle import rare_full_collections
from mmdatagen.loadgen.run import run_bench


def test_the_block_freezes_what_lives_and_holds_full_collections_off():
    before, frozen = gc.get_threshold(), gc.get_freeze_count()
    with rare_full_collections():
        assert gc.get_freeze_count() > frozen
        assert gc.get_threshold()[:2] == before[:2] and gc.get_threshold()[2] >= 1 << 30
    assert gc.get_threshold() == before and gc.get_freeze_count() == frozen


def test_a_callers_freeze_outlives_the_block():
    gc.freeze()
    try:
        frozen = gc.get_freeze_count()
        with rare_full_collections():
            assert gc.get_threshold()[2] >= 1 << 30
        # not released by the block (that would leave 0); a frozen object may die meanwhile,
        # another thread's included (CI saw 531,374 of 531,376 left)
        assert gc.get_freeze_count() > 0.99 * frozen
    finally:
        gc.unfreeze()


def test_no_full_collection_falls_among_a_benchmarks_requests(tmp_path):
    """With thresholds that make a full collection every few dozen allocations, some happen
    before and after the run, none between its first request and its last response."""
    path = write_jsonl(tmp_path / "d.jsonl", [{"text": f"hello {i}"} for i in range(60)])
    full: list[int] = []

    def note(phase: str, info: dict) -> None:
        if phase == "start" and info["generation"] == 2:
            full.append(time.perf_counter_ns())

    saved = gc.get_threshold()
    with Stub() as stub:
        # a full collection waits for its objects to grow by a quarter: with the heap frozen
        # first, a few hundred new ones are that quarter
        gc.freeze()
        gc.collect()
        gc.set_threshold(50, 1, 1)
        gc.callbacks.append(note)
        try:
            res = run_bench(bench_config(path, stub.url, tmp_path / "out", concurrency=4,
                                         streaming=True))
        finally:
            gc.callbacks.remove(note)
            gc.set_threshold(*saved)
            gc.unfreeze()
    assert len(res.records) == 60 and res.export["error_request_count"]["avg"] == 0
    first = min(r.start_ns for r in res.records)
    last = max(r.response_end_ns or r.end_ns for r in res.records)
    assert any(t < first or t > last for t in full), "no full collection at all: a dead test"
    assert [t for t in full if first <= t <= last] == []
