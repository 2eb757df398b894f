"""Sharded load workers (``bench --num-shards N --shard-index K``) and ``merge-runs``: the
workers together send the benchmark one process would, sessions whole; the merged export
agrees with a single-process run of the same benchmark and its percentiles are those of the
union of the records."""
from __future__ import annotations

import shutil
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import orjson
import pytest
from hypothesis import given
from hypothesis import strategies as st
from loadgen_helpers import late_for_the_start, serve, with_common_start

from mmdatagen.loadgen.shard import Shard, seconds_to_start, shard_config
from mmdatagen.sessions import shard_owns

MODEL = "Qwen/Qwen3-VL-30B-A3B-Instruct-FP8"


@given(total=st.integers(0, 10**6), n=st.integers(1, 64))
def test_shares_add_up_to_the_whole(total, n):
    shares = [Shard(k, n).share(total) for k in range(n)]
    assert sum(shares) == total and max(shares) - min(shares) <= 1


@given(n=st.integers(1, 16), sessions=st.integers(0, 200))
def test_every_session_has_exactly_one_worker(n, sessions):
    owners = [[k for k in range(n) if shard_owns(s, k, n)] for s in range(sessions)]
    assert all(len(o) == 1 for o in owners)


def test_config_is_divided_and_checked():
    from mmdatagen.errors import SpecError
    from mmdatagen.settings.load import Load

    load = Load(input_file=Path("d.jsonl"), model="m", concurrency=7, request_count=10,
                request_rate=9.0, ramp_to=18.0, warmup_request_count=3, seed=5)
    url = "http://127.0.0.1:1"
    parts = [shard_config(load, url, Shard(k, 3)) for k in range(3)]
    assert [p.concurrency for p in parts] == [2, 2, 3]
    assert [p.request_count for p in parts] == [3, 3, 4]
    assert [p.warmup_request_count for p in parts] == [1, 1, 1]
    assert {p.request_rate for p in parts} == {3.0} and {p.ramp_to for p in parts} == {6.0}
    assert len({Shard(k, 3).seed(5) for k in range(3)}) == 3 and Shard(0, 1).seed(5) == 5
    with pytest.raises(SpecError, match="concurrency"):
        shard_config(load, url, Shard(0, 8))
    with pytest.raises(SpecError, match="url"):
        shard_config(load, None, Shard(0, 2))
    with pytest.raises(SpecError, match="in the past"):
        seconds_to_start(time.time() - 5)


def test_a_worker_runs_its_share_under_the_undivided_benchmarks_digest():
    """``worker_run``: one process's part of a run: the run itself unsharded, else its share of
    the load with the digest of the whole benchmark's settings (the same for every worker, the
    output folders and indexes apart); a start in the past refused either way."""
    from dataclasses import replace

    from mmdatagen.errors import SpecError
    from mmdatagen.loadgen.shard import settings_digest, worker_run
    from mmdatagen.settings.load import BenchTarget, Load, LoadShard
    from mmdatagen.settings.run import BenchRun

    load = Load(input_file=Path("d.jsonl"), model="m", concurrency=4, request_count=10)
    alone = BenchRun(load, BenchTarget(url="http://127.0.0.1:1"))
    assert worker_run(alone) is alone
    runs = [replace(alone, shard=LoadShard(num_shards=2, shard_index=k),
                    target=BenchTarget(url="http://127.0.0.1:1", output_dir=Path(f"w{k}")))
            for k in range(2)]
    parts = [worker_run(r) for r in runs]
    assert [p.load.request_count for p in parts] == [5, 5]
    assert [p.load.concurrency for p in parts] == [2, 2]
    assert parts[0].shard_digest == parts[1].shard_digest == settings_digest(runs[0].public())
    assert parts[0].public()["request_count"] == 5  # the export records the worker's share
    with pytest.raises(SpecError, match="start_at"):
        worker_run(replace(alone, shard=LoadShard(start_at=time.time() - 5)))


def _mmdatagen(*args, **kw):
    return subprocess.run([sys.executable, "-m", "mmdatagen", *map(str, args)],
                          capture_output=True, text=True, timeout=300, **kw)


def _export(d: Path) -> dict:
    return orjson.loads((d / "profile_export_mmdatagen.json").read_bytes())


def _records(d: Path) -> list[dict]:
    return [orjson.loads(x) for x in (d / "records.jsonl").read_bytes().splitlines()]


def test_two_workers_merge_into_the_single_process_benchmark(tmp_path):
    data = tmp_path / "sw.jsonl"
    res = _mmdatagen("sliding-window", "--users", 6, "--turns", 4, "--window", 2,
                     "--image-size", "64x48", "--text-tokens", 16, "-o", data, "-q")
    assert res.returncode == 0, res.stderr
    common = ["--model", MODEL, "--concurrency", 4, "--cache-size", 1, "--encoder-budget", 300,
              "-q", "--no-report"]

    def run(margin: float) -> list[str]:
        """The two workers from ``mmdatagen serve`` (zero-delay profile) in its own process,
        merged; then the single process on the same server, its cache reset."""
        for name in ("w0", "w1", "merged", "single"):  # a late attempt's exports
            shutil.rmtree(tmp_path / name, ignore_errors=True)
        with serve(tmp_path, "--encoder-budget", "300") as url:
            start = time.time() + margin
            late = late_for_the_start([subprocess.Popen(
                [sys.executable, "-m", "mmdatagen", "bench", "--input-file", str(data), "--url",
                 url, *map(str, common), "--num-shards", "2", "--shard-index", str(k),
                 "--start-at", str(start), "--output-dir", str(tmp_path / f"w{k}")],
                stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True) for k in range(2)])
            if late:
                return late
            res = _mmdatagen("merge-runs", tmp_path / "w0", tmp_path / "w1", "--output-dir",
                             tmp_path / "merged", "-q")
            assert res.returncode == 0, res.stderr
            res = _mmdatagen("bench", "--input-file", data, "--url", url, *common,
                             "--reset-cache", "--output-dir", tmp_path / "single")
            assert res.returncode == 0, res.stderr
        return []

    with_common_start(run)
    merged, single = _export(tmp_path / "merged"), _export(tmp_path / "single")
    assert merged["request_count"]["avg"] == single["request_count"]["avg"] == 24
    # sessions whole: each user's turns all went through one worker, in order
    by_worker = {k: {r["metadata"]["conversation_id"] for r in _records(tmp_path / f"w{k}")}
                 for k in range(2)}
    assert by_worker[0].isdisjoint(by_worker[1]) and len(by_worker[0] | by_worker[1]) == 6
    recs = _records(tmp_path / "merged")
    for user in by_worker[0] | by_worker[1]:
        turns = sorted((r["metadata"]["request_start_ns"], r["metadata"]["turn_index"])
                       for r in recs if r["metadata"]["conversation_id"] == user)
        assert [t for _, t in turns] == [0, 1, 2, 3]
    # the prediction over both workers' requests, in the server's order, equals its counters
    cache = merged["image_cache"]
    assert cache["predicted"]["hits"] == cache["measured"]["hits"]
    assert cache["predicted"]["order"].startswith("the server's cache timeline")
    # percentiles are those of the union of the records, not averages of the workers'
    ttft = [r["metrics"]["time_to_first_token"]["value"] for r in recs
            if r["metadata"]["benchmark_phase"] == "profiling"]
    for stat, q in (("p50", 50), ("p90", 90), ("p99", 99)):
        assert merged["time_to_first_token"][stat] == pytest.approx(np.percentile(ttft, q))
    shards = merged["run_info"]["shards"]
    assert [s["index"] for s in shards] == [0, 1]
    assert all(s["clock"]["source"] == "simulator clock header" for s in shards)


def _fake_worker(d: Path, index: int, count: int, settings: str = "s", dataset: str = "d"):
    d.mkdir(parents=True)
    export = {"run_info": {"shard": {"index": index, "count": count, "settings_blake3": settings,
                                     "dataset_blake3": dataset, "wall_offset_ns": 0,
                                     "dispatched": 0}}}
    (d / "profile_export_mmdatagen.json").write_bytes(orjson.dumps(export))
    (d / "records.jsonl").write_bytes(b"")


@pytest.mark.parametrize("workers,needle", [
    ([(0, 3), (1, 3)], "shard 2 of 3 missing"),
    ([(0, 2), (0, 2)], "shard 0 is given twice"),
    ([(0, 2), (1, 3)], "different benchmarks (their shard count differ)"),
    ([(0, 2, "s"), (1, 2, "t")], "different benchmarks (their settings differ)"),
    ([(0, 2, "s", "d"), (1, 2, "s", "e")], "different benchmarks (their dataset differ)"),
])
def test_merge_runs_refuses_what_does_not_belong_together(tmp_path, workers, needle):
    dirs = []
    for n, w in enumerate(workers):
        _fake_worker(tmp_path / f"w{n}", *w)
        dirs.append(tmp_path / f"w{n}")
    res = _mmdatagen("merge-runs", *dirs, "--output-dir", tmp_path / "out")
    assert res.returncode == 2 and needle in res.stderr and "Traceback" not in res.stderr
    assert not (tmp_path / "out" / "profile_export_mmdatagen.json").exists()


def test_a_plain_run_folder_and_a_past_start_are_refused(tmp_path):
    (tmp_path / "plain").mkdir()
    (tmp_path / "plain" / "profile_export_mmdatagen.json").write_text('{"run_info": {}}')
    res = _mmdatagen("merge-runs", tmp_path / "plain", "--output-dir", tmp_path / "out")
    assert res.returncode == 2 and "not a load worker's run" in res.stderr
    data = tmp_path / "d.jsonl"
    data.write_text('{"text": "hi"}\n')
    res = _mmdatagen("bench", "--input-file", data, "--url", "http://127.0.0.1:9",
                     "--model", "m", "--num-shards", 2, "--concurrency", 2,
                     "--start-at", int(time.time()) - 10, "--output-dir", tmp_path / "o")
    assert res.returncode == 2 and "--start-at is" in res.stderr and "past" in res.stderr
    res = _mmdatagen("bench", "--input-file", data, "--num-shards", 2, "--shard-index", 2,
                     "--output-dir", tmp_path / "o")
    assert res.returncode == 2 and "--shard-index must be below" in res.stderr


@pytest.mark.parametrize("processes", [1, 2])
def test_merged_records_are_the_shifted_union_byte_for_byte(tmp_path, processes):
    """merge-runs reads and writes whole columns: its records.jsonl is exactly the lines of
    every worker's records moved onto the server's clock, in start order (ties: shard order),
    and its percentiles are those of that union; read in this process or in a pool of two."""
    import dataclasses
    import random

    from mmdatagen.export import record_line, record_lines
    from mmdatagen.loadgen.merge_runs import merge_runs
    from mmdatagen.metrics import RequestRecord

    rnd = random.Random(7)
    expected, dirs = [], []
    for k, clock in enumerate((1_700_000_000_000_000_000, 1_700_000_000_000_500_000)):
        recs = []
        for i in range(40):
            s = rnd.randrange(0, 10**9, 1000)  # ties across the workers too
            fail = i % 9 == 4
            first = None if fail else s + rnd.randrange(1, 10**7)
            recs.append(RequestRecord(
                conversation_id=f"u{k}-{i // 3}", turn_index=i % 3,
                phase="warmup" if i < 3 else "profiling", start_ns=s, first_token_ns=first,
                end_ns=None if fail else first + rnd.randrange(0, 10**8),
                output_tokens=0 if fail else rnd.randrange(1, 40), input_tokens=100,
                num_images=i % 3, error={"type": "HTTPError", "code": 500, "message": "x"}
                if fail else None, image_hits=i % 2, image_misses=1, server_ttft_ns=50_000,
                x_request_id=f"{k}-{i}", response_end_ns=None if fail else s + 2 * 10**8,
                predicted_hits=None, http_status=500 if fail else 200, dispatch_index=i))
        d = tmp_path / f"w{k}"
        d.mkdir()
        shard = {"index": k, "count": 2, "settings_blake3": "s", "dataset_blake3": "d",
                 "wall_offset_ns": clock, "dispatched": 40, "clock": {"offset_ns": -7 * k}}
        (d / "profile_export_mmdatagen.json").write_bytes(orjson.dumps(
            {"input_config": {"model": MODEL}, "run_info": {"shard": shard}}))
        (d / "records.jsonl").write_bytes(b"".join(record_lines(recs)))
        by = clock - 7 * k
        expected += [dataclasses.replace(
            r, start_ns=r.start_ns + by, dispatch_index=r.dispatch_index + 40 * k,
            **{f: getattr(r, f) + by for f in ("first_token_ns", "end_ns", "response_end_ns")
               if getattr(r, f) is not None}) for r in sorted(recs, key=lambda r: r.start_ns)]
        dirs.append(d)
    res = merge_runs(dirs, tmp_path / "merged", processes=processes)
    ordered = sorted(expected, key=lambda r: r.start_ns)
    assert (tmp_path / "merged" / "records.jsonl").read_bytes() == b"".join(
        orjson.dumps(record_line(r)) + b"\n" for r in ordered)
    ttft = [r.values()["time_to_first_token"] for r in ordered
            if r.phase == "profiling" and r.ok]
    assert len(res.records) == 80 and res.export["request_count"]["avg"] == len(ttft)
    for stat, q in (("p50", 50), ("p99", 99), ("min", 0)):
        assert res.export["time_to_first_token"][stat] == pytest.approx(np.percentile(ttft, q))


@pytest.mark.parametrize("items,needle", [
    (b"not json\n", "not a cache_items.jsonl header"),
    (b'{"target": "vllm-processor"}\n', "not a cache_items.jsonl header ('cache_size')"),
    (b'{"target": "vllm-processor", "cache_size": 4, "front": null, "bytes_per_token": 2, '
     b'"model": "m"}\n{"images": 1, "items": [["k", 5]]}\n{"images": 1}\n',
     "not a cache_items.jsonl line ('items')"),
    (b'{"target": "vllm-processor", "cache_size": 4, "front": null, "bytes_per_token": 2, '
     b'"model": "m"}\n{"images": 1, "items": [["k", -5]]}\n',
     "an item size or image count that is not a whole number of 0 or more"),
    (b'{"target": "vllm-processor", "cache_size": 4, "front": null, "bytes_per_token": 2, '
     b'"model": "m"}\n{"images": 1, "items": [["k", "5"]]}\n',
     "an item size or image count that is not a whole number of 0 or more"),
])
def test_merge_runs_names_a_bad_cache_items_file(tmp_path, items, needle):
    for k in range(2):
        _fake_worker(tmp_path / f"w{k}", k, 2)
        (tmp_path / f"w{k}" / "cache_items.jsonl").write_bytes(
            items if k else b'{"target": "vllm-processor", "cache_size": 4, "front": null, '
                            b'"bytes_per_token": 2, "model": "m"}\n')
    res = _mmdatagen("merge-runs", tmp_path / "w0", tmp_path / "w1", "--output-dir",
                     tmp_path / "out")
    assert res.returncode == 2 and "Traceback" not in res.stderr
    assert needle in res.stderr and "w1/cache_items.jsonl" in res.stderr
    assert not (tmp_path / "out" / "profile_export_mmdatagen.json").exists()


def test_a_bad_records_line_read_in_the_pool_is_one_line(tmp_path):
    """A worker's records are parsed in a pool process: its DatasetError still reaches the
    user as one line naming the file and line, exit 2, nothing written."""
    from mmdatagen.export import record_lines
    from mmdatagen.metrics import RequestRecord

    for k in range(2):
        _fake_worker(tmp_path / f"w{k}", k, 2)
        rec = RequestRecord(conversation_id="c", turn_index=0, phase="profiling", start_ns=5,
                            first_token_ns=9, end_ns=20, output_tokens=3, input_tokens=10,
                            num_images=0, error=None, image_hits=None, image_misses=None,
                            server_ttft_ns=None, x_request_id="r")
        (tmp_path / f"w{k}" / "records.jsonl").write_bytes(
            b"".join(record_lines([rec])) + (b'{"metadata": [1]}\n' if k else b""))
    res = _mmdatagen("merge-runs", tmp_path / "w0", tmp_path / "w1", "--workers", 2,
                     "--output-dir", tmp_path / "out")
    assert res.returncode == 2 and "Traceback" not in res.stderr, res.stderr
    assert "w1/records.jsonl:2: not a records.jsonl line" in res.stderr
    assert len(res.stderr.strip().splitlines()) == 1
    assert not (tmp_path / "out" / "profile_export_mmdatagen.json").exists()


def test_merge_runs_is_the_one_writer_of_its_folder(tmp_path):
    """merge-runs holds its output folder: the temporaries a killed merge left there (its
    forked writers' parts, the export's) are removed, and a second writer of the folder gets
    one line and exit 2 while the first holds it."""
    from mmdatagen.io.atomic import output_lock

    dirs = []
    for k in range(2):
        _fake_worker(tmp_path / f"w{k}", k, 2)
        dirs.append(tmp_path / f"w{k}")
    out = tmp_path / "out"
    out.mkdir()
    stale = [out / ".records.jsonl.k1ll3d00.part",
             out / ".profile_export_mmdatagen.json.abcd1234.part"]
    for f in stale:
        f.write_bytes(b'{"half": ')
    keep = out / ".notes.txt.abcd1234.part"  # not a temporary of merge-runs' files
    keep.write_bytes(b"x")
    with output_lock(out):
        res = _mmdatagen("merge-runs", *dirs, "--output-dir", out)
        assert res.returncode == 2 and "another process is writing" in res.stderr
        assert "Traceback" not in res.stderr and all(f.exists() for f in stale)
    res = _mmdatagen("merge-runs", *dirs, "--output-dir", out, "--quiet")
    assert res.returncode == 0, res.stderr
    assert not any(f.exists() for f in stale) and keep.exists()
    assert (out / "profile_export_mmdatagen.json").exists()
    assert not list(tmp_path.glob(".out.lock"))
