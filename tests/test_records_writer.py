"""records.jsonl written by several processes (``export.records_writer``, merge-runs' writers):
the same bytes as one process writes, whatever part each process took; the export's maths run
meanwhile; nothing is left behind, on success or failure."""
from __future__ import annotations

import random
from pathlib import Path

import orjson
import pytest

from mmdatagen import export
from mmdatagen.export import record_line, record_lines, records_writer, write_exports
from mmdatagen.metrics import RecordTable, RequestRecord


def _records(n: int, seed: int = 3) -> list[RequestRecord]:
    rnd = random.Random(seed)
    out = []
    for i in range(n):
        start = rnd.randrange(0, 10**6, 1000)  # ties in start time
        fail = i % 7 == 3
        first = None if fail else start + rnd.randrange(1, 10**6)
        out.append(RequestRecord(
            conversation_id=f'c"{i // 3}%s', turn_index=i % 3,
            phase="warmup" if i < 4 else "profiling", start_ns=start, first_token_ns=first,
            end_ns=None if fail else first + rnd.randrange(0, 10**7),
            output_tokens=0 if fail else rnd.randrange(1, 50), input_tokens=rnd.choice([None, 9]),
            num_images=i % 4, error={"type": "HTTPError", "code": 500, "message": "x"}
            if fail else None, image_hits=None if fail else i % 2, image_misses=1,
            server_ttft_ns=None if i % 5 == 0 else 40_000, x_request_id=f"r-{i}",
            streaming=i % 11 != 0, response_end_ns=None if fail else start + 2 * 10**7,
            predicted_hits=i % 3 or None, http_status=500 if fail else 200, dispatch_index=i))
    return out


def _leftovers(folder: Path) -> list[str]:
    return sorted(p.name for p in folder.iterdir() if p.name.startswith("."))


@pytest.mark.parametrize("processes", [1, 2, 3])
def test_parts_written_by_several_processes_are_the_one_process_bytes(tmp_path, monkeypatch,
                                                                      processes):
    recs = _records(203)
    expected = b"".join(orjson.dumps(record_line(r)) + b"\n"
                        for r in sorted(recs, key=lambda r: r.start_ns))
    assert b"".join(record_lines(RecordTable.from_records(recs))) == expected
    monkeypatch.setattr(export, "_PART_ROWS", 8)  # 26 parts: every process takes some
    ran = []
    with open(tmp_path / "records.jsonl", "wb") as fh:
        with records_writer(fh, RecordTable.from_records(recs), tmp_path, processes):
            ran.append(True)  # the export's maths would run here
    assert ran and (tmp_path / "records.jsonl").read_bytes() == expected
    assert _leftovers(tmp_path) == []


def test_write_exports_makes_the_document_while_the_records_are_written(tmp_path, monkeypatch):
    monkeypatch.setattr(export, "_PART_ROWS", 16)
    recs = _records(150)
    calls = []

    def document() -> dict:
        calls.append(1)
        return {"records": len(recs)}

    paths = write_exports(tmp_path / "out", RecordTable.from_records(recs), document,
                          processes=2)
    assert calls == [1]
    assert orjson.loads(paths["export"].read_bytes()) == {"records": 150}
    assert paths["records"].read_bytes() == b"".join(record_lines(recs))
    assert _leftovers(tmp_path / "out") == []


def test_a_failure_while_the_writers_run_leaves_nothing(tmp_path, monkeypatch):
    monkeypatch.setattr(export, "_PART_ROWS", 16)
    out = tmp_path / "out"

    def document() -> dict:
        raise RuntimeError("maths failed")

    with pytest.raises(RuntimeError, match="maths failed"):
        write_exports(out, RecordTable.from_records(_records(150)), document, processes=2)
    assert list(out.iterdir()) == []  # no export, no records, no part files


def test_merge_runs_writes_the_same_bytes_with_one_or_two_processes(tmp_path, monkeypatch):
    """merge-runs with its records written in parts by two processes (and read by two):
    byte for byte what one process writes."""
    from mmdatagen.loadgen.merge_runs import merge_runs

    monkeypatch.setattr(export, "_PART_ROWS", 8)
    dirs = []
    for k in range(3):
        d = tmp_path / f"w{k}"
        d.mkdir()
        recs = _records(60, seed=k)
        shard = {"index": k, "count": 3, "settings_blake3": "s", "dataset_blake3": "d",
                 "wall_offset_ns": 10**18 + 333 * k, "dispatched": 60,
                 "clock": {"offset_ns": -5 * k}}
        (d / "profile_export_mmdatagen.json").write_bytes(orjson.dumps(
            {"input_config": {"model": "m"}, "run_info": {"shard": shard}}))
        (d / "records.jsonl").write_bytes(b"".join(record_lines(recs)))
        dirs.append(d)
    one = merge_runs(dirs, tmp_path / "one", processes=1)
    two = merge_runs(dirs, tmp_path / "two", processes=2)
    assert (tmp_path / "one" / "records.jsonl").read_bytes() == (
        tmp_path / "two" / "records.jsonl").read_bytes()
    one.export.pop("benchmark_id")
    two.export.pop("benchmark_id")
    assert one.export["run_info"].pop("merged_runs") == two.export["run_info"].pop("merged_runs")
    assert one.export == two.export
    assert _leftovers(tmp_path / "two") == []
