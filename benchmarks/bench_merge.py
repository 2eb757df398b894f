"""``mmdatagen merge-runs`` over 1,000,000 records, measured in one run against its goals
(issue 21): at most 10 s and at most 1 GB.

    python benchmarks/bench_merge.py                 # records alone, then with cache items
    python benchmarks/bench_merge.py --no-items      # records alone

The workers' folders are synthetic but shaped as ``bench --num-shards`` writes them
(records.jsonl lines of ~1 KB with their metrics, a few failed requests, warmup), 4 workers.
Each merge runs in a child process that times itself from before its imports to its exit:
wall and CPU seconds, peak RSS (``ru_maxrss``), and where its CPU went (reading its share of
the records, the cache items, the prediction's events and replay (it reads the record table's
columns; "record objects" is what is left of making RequestRecords), writing, and within
writing the export's maths and the prediction's order band (``loadgen/band.py``), done while
forked writers serialise records.jsonl); the CPU of the processes it forks (readers, writers)
beside. The run with cache items replays the merged prediction.

The machine may be shared: the load average is printed with each run, and CPU seconds beside
wall seconds.
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

MODEL = "Qwen/Qwen3-VL-30B-A3B-Instruct-FP8"
#: the phases of a merge (function -> what it is), timed in the child
PHASES = (("mmdatagen.loadgen.merge_runs", "", "_table", "read records"),
          ("mmdatagen.loadgen.merge_runs", "", "_items", "read cache items"),
          ("mmdatagen.loadgen.merge_runs", "", "merged_prediction", "prediction (all)"),
          ("mmdatagen.metrics", "RecordTable", "records", "record objects"),
          ("mmdatagen.loadgen.predict", "ImageTracker", "events", "prediction events"),
          ("mmdatagen.loadgen.predict", "ImageTracker", "replay", "prediction replay"),
          ("mmdatagen.loadgen.predict", "ImageTracker", "band", "order band"),
          ("mmdatagen.export", "", "build_export", "export maths"),
          ("mmdatagen.report.aggregate", "", "run_aggregates", "aggregates"),
          ("mmdatagen.export", "", "write_exports", "write export"))
#: phases timed inside another (the export's maths, and the merged prediction's order band,
#: run within write_exports while the forked writers write)
NESTED = {"export maths", "aggregates", "order band"}


def _load() -> str:
    return f"load {os.getloadavg()[0]:.1f}"


def fake_workers(tmp: Path, total: int, workers: int, cache_items: bool) -> list[Path]:
    """Worker folders as ``bench --num-shards`` writes them, from seeded draws: the export with
    its shard, records.jsonl (by start time), and cache_items.jsonl when ``cache_items``."""
    import numpy as np
    import orjson

    from mmdatagen.caches import get_target
    from mmdatagen.caches.entries import entry_size
    from mmdatagen.export import record_lines
    from mmdatagen.loadgen.predict import CACHE_ITEMS_NAME
    from mmdatagen.metrics import RecordTable
    from mmdatagen.vlm import resolve_model

    target, model = get_target("dynamo-embedding"), resolve_model(MODEL)
    sizes = [entry_size(target, model, w, h) for w, h in ((640, 480), (1280, 720), (2400, 1080))]
    rng = np.random.default_rng(0)
    dirs = []
    for k in range(workers):
        d = tmp / f"worker-{k}"
        d.mkdir(parents=True)
        n = total * (k + 1) // workers - total * k // workers
        i = np.arange(n)
        start = 10**12 + k * 7_777 + np.cumsum(rng.exponential(250_000.0, n).astype(np.int64))
        ttft = rng.gamma(4.0, 500_000.0, n).astype(np.int64)
        dur = rng.gamma(3.0, 10_000_000.0, n).astype(np.int64)
        fail = i % 997 == 13
        images = rng.integers(0, 4, n)
        hits = rng.binomial(images, 0.3)
        none = np.full(n, None, object)

        def ok(v: np.ndarray, fail: np.ndarray = fail) -> list:
            return np.where(fail, None, v).tolist()

        table = RecordTable.from_columns({
            "conversation_id": [f"conv-{k}-{j // 4:07d}" for j in range(n)],
            "turn_index": (i % 4).tolist(), "phase": np.where(i < 50, "warmup", "profiling")
            .astype(object).tolist(), "start_ns": start.tolist(),
            "first_token_ns": ok(start + ttft), "end_ns": ok(start + ttft + dur),
            "response_end_ns": ok(start + ttft + dur + 40_000),
            "output_tokens": np.where(fail, 0, rng.integers(8, 256, n)).tolist(),
            "input_tokens": (900 + 700 * images).tolist(), "num_images": images.tolist(),
            "error": np.where(fail, {"type": "HTTPError", "code": 500,
                                     "message": "Internal Server Error"}, none).tolist(),
            "image_hits": ok(hits), "image_misses": ok(images - hits),
            "server_ttft_ns": ok(ttft - 150_000), "x_request_id":
                [f"{k:08x}-{j:04x}-4{j % 4096:03x}-8{j % 3331:03x}-{j * 7919:012x}"[:36]
                 for j in range(n)], "http_status": np.where(fail, 500, 200).tolist(),
            "dispatch_index": i.tolist()})
        with open(d / "records.jsonl", "wb") as fh:
            fh.writelines(record_lines(table))
        if cache_items:
            keys = rng.integers(0, 20_000, (n, 3))
            with open(d / CACHE_ITEMS_NAME, "wb") as fh:
                fh.write(orjson.dumps({"target": target.name, "cache_size": 10.0,
                                       "front": 16384,
                                       "bytes_per_token": model.bytes_per_token,
                                       "model": model.name}) + b"\n")
                for j in range(n):
                    items = [[f"{x:032x}", sizes[x % 3]] for x in keys[j, :images[j]].tolist()]
                    fh.write(orjson.dumps({"dispatch_index": j, "x_request_id":
                                           table.x_request_id[j], "images": int(images[j]),
                                           "items": items, "seqs": None}) + b"\n")
        shard = {"index": k, "count": workers, "settings_blake3": "s", "dataset_blake3": "d",
                 "wall_offset_ns": 1_700_000_000_000_000_000 + 1_000 * k, "dispatched": n,
                 "clock": {"source": "simulator clock header", "offset_ns": -250 * k,
                           "uncertainty_ns": 40_000}}
        export = {"input_config": {"model": MODEL, "concurrency": 64, "shard_index": k},
                  "run_info": {"shard": shard}, "was_cancelled": False}
        (d / "profile_export_mmdatagen.json").write_bytes(orjson.dumps(export))
        dirs.append(d)
    return dirs


def _child(argv: list[str]) -> None:
    """Run ``mmdatagen merge-runs argv`` here, timing each phase; print the times as JSON."""
    t0, c0 = time.perf_counter(), time.process_time()
    import functools
    import importlib
    import resource

    spent: dict[str, float] = {}

    def timed(fn, name):
        @functools.wraps(fn)
        def run(*a, **k):
            c = time.process_time()
            try:
                return fn(*a, **k)
            finally:
                spent[name] = spent.get(name, 0.0) + time.process_time() - c
        return run

    for module, cls, attr, name in PHASES:
        owner = importlib.import_module(module)
        owner = getattr(owner, cls) if cls else owner
        setattr(owner, attr, timed(getattr(owner, attr), name))
    from mmdatagen.cli import cli

    code = cli.main(["merge-runs", *argv], prog_name="mmdatagen", standalone_mode=False)
    usage = resource.getrusage(resource.RUSAGE_SELF)
    kids = resource.getrusage(resource.RUSAGE_CHILDREN)  # the merge's readers and writers
    print(json.dumps({"rc": code or 0, "wall": time.perf_counter() - t0,
                      "cpu": time.process_time() - c0, "user_sys": usage.ru_utime
                      + usage.ru_stime, "rss_mib": usage.ru_maxrss / 1024, "spent": spent,
                      "children_cpu": kids.ru_utime + kids.ru_stime,
                      "children_rss_mib": kids.ru_maxrss / 1024}))


def measure(dirs: list[Path], out: Path, processes: int = 0) -> dict:
    """One merge of ``dirs`` in a child process (``processes`` readers and writers, 0: one per
    core): its times, peak RSS and phases."""
    res = subprocess.run([sys.executable, __file__, "--child", *map(str, dirs), "--output-dir",
                          str(out), "-q", "--no-report", "--workers", str(processes)],
                         capture_output=True, text=True, timeout=3600)
    if res.returncode:
        raise SystemExit(f"merge-runs failed: {res.stderr.strip()[-2000:]}")
    return json.loads(res.stdout.strip().splitlines()[-1])


def part_merge(tmp: Path, records: int, with_items: bool) -> None:
    """Print one line per merge (records alone; with cache items) against the goals, where
    its CPU went, and (records alone) the same merge in one process, for the ratio."""
    for items in (False, True) if with_items else (False,):
        t = time.perf_counter()
        dirs = fake_workers(tmp / f"items{int(items)}", records, 4, items)
        made = time.perf_counter() - t
        load = _load()
        res = measure(dirs, tmp / f"merged{int(items)}")
        size = sum((d / "records.jsonl").stat().st_size for d in dirs) / 1e9
        what = "with cache items (merged prediction)" if items else "records + exports"
        print(f"merge-runs, {records:,} records from 4 workers ({size:.2f} GB of records.jsonl,"
              f" {what}): {res['wall']:.1f} s wall, {res['cpu']:.1f} s CPU (+ "
              f"{res['children_cpu']:.1f} s in its readers and writers), peak "
              f"{res['rss_mib']:.0f} MiB (largest of those {res['children_rss_mib']:.0f} MiB) "
              f"(goals: <= 10 s: {res['wall'] / 10:.2f} of it; <= 1 GB: "
              f"{res['rss_mib'] / 1024:.2f} of it); "
              f"{load} -> {_load()} (inputs written in {made:.0f} s)")
        spent = res["spent"]
        own = spent.get("prediction (all)", 0.0) - sum(
            spent.get(k, 0.0) for k in ("prediction events", "prediction replay"))
        parts = [(k, v) for k, v in spent.items() if k != "prediction (all)" and v >= 0.005]
        if items:
            parts.append(("rest of prediction", own - spent.get("record objects", 0.0)))
        print("  CPU s: " + ", ".join(f"{k} {v:.2f}" if k not in NESTED else f"({k} {v:.2f})"
                                      for k, v in parts)
              + "; other (start-up, imports, merge) "
              + f"{res['cpu'] - sum(v for k, v in parts if k not in NESTED):.2f}")
        if not items:
            one = measure(dirs, tmp / "merged-one", processes=1)
            print(f"  in one process (--workers 1): {one['wall']:.1f} s wall, peak "
                  f"{one['rss_mib']:.0f} MiB; the pool's speed-up {one['wall'] / res['wall']:.2f}x"
                  f" ({_load()})")


def main() -> int:
    if len(sys.argv) > 1 and sys.argv[1] == "--child":
        _child(sys.argv[2:])
        return 0
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--records", type=int, default=1_000_000, help="records over all workers")
    ap.add_argument("--no-items", action="store_true", help="skip the run with cache items")
    args = ap.parse_args()
    with tempfile.TemporaryDirectory() as t:
        part_merge(Path(t), args.records, not args.no_items)
    return 0


if __name__ == "__main__":
    sys.exit(main())
