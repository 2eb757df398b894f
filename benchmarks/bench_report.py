"""Report build time and size for a 100k-request run (goal: under 5 s and under 5 MB).

Builds 100,000 synthetic request records (64 streams over about 10 minutes: TTFT, 150 output
tokens, cache hits), then measures, in one run:

1. in memory (what ``bench`` does after a run): aggregates -> export -> report.html;
2. from disk (a folder written earlier): records.jsonl read back -> aggregates -> report.html;

and prints the seconds of each step and the HTML size against the goals.

    python benchmarks/bench_report.py [--requests 100000]
"""
from __future__ import annotations

import argparse
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import orjson

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from mmdatagen.export import build_export, read_records, write_exports  # noqa: E402
from mmdatagen.metrics import RECORDS_NAME, RequestRecord  # noqa: E402
from mmdatagen.report.aggregate import Columns, aggregates, run_aggregates  # noqa: E402
from mmdatagen.report.html import runs_report  # noqa: E402


def synthetic(n: int, seed: int = 0) -> list[RequestRecord]:
    rng = np.random.default_rng(seed)
    streams = 64
    ttft = rng.lognormal(np.log(300), 0.6, n)  # ms
    itl = rng.normal(14.0, 1.5, n).clip(5, None)
    lat = ttft + itl * 149
    start = np.zeros(n)
    free = np.zeros(streams)
    for i in range(n):  # 64 closed-loop streams
        s = int(np.argmin(free))
        start[i] = free[s]
        free[s] += lat[i]
    hits = (rng.random(n) < 0.8).astype(int)
    recs = []
    ms = 1_000_000
    for i in range(n):
        st = int(start[i] * ms)
        recs.append(RequestRecord(
            conversation_id=f"c{i}", turn_index=0, phase="profiling", start_ns=st,
            first_token_ns=st + int(ttft[i] * ms), end_ns=st + int(lat[i] * ms),
            output_tokens=150, input_tokens=700, num_images=1, error=None,
            image_hits=int(hits[i]), image_misses=int(1 - hits[i]), server_ttft_ns=None,
            x_request_id=f"r{i}", streaming=True, response_end_ns=st + int(lat[i] * ms) + 1000,
            predicted_hits=int(hits[i])))
    return recs


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--requests", type=int, default=100_000)
    args = ap.parse_args()
    recs = synthetic(args.requests)
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp)
        export = build_export(recs, input_config={"input_file": "synthetic"})
        write_exports(out / "run", recs, export)  # the folder a later report reads

        c0 = time.process_time()
        t0 = time.perf_counter()
        agg = run_aggregates(recs)
        t1 = time.perf_counter()
        export.update(agg)
        rep = runs_report("bench", [("run", export)], "mmdatagen bench")
        res = rep.write(out / "mem")
        t2 = time.perf_counter()
        c2 = time.process_time()
        size = res["html"].stat().st_size

        c3 = time.process_time()
        t3 = time.perf_counter()
        cols = Columns(read_records(out / "run" / RECORDS_NAME))
        ex2 = orjson.loads((out / "run" / "profile_export_mmdatagen.json").read_bytes())
        ex2.update(aggregates(cols))
        t4 = time.perf_counter()
        runs_report("bench", [("run", ex2)], "mmdatagen bench").write(out / "disk")
        t5 = time.perf_counter()
        c5 = time.process_time()
        export_kb = len(orjson.dumps(agg)) / 1024

    n = args.requests
    print(f"requests: {n:,}")
    print(f"in memory: aggregates {t1 - t0:.2f} s + report {t2 - t1:.2f} s = {t2 - t0:.2f} s "
          f"(goal < 5 s: {(t2 - t0) / 5:.2f} of budget; CPU {c2 - c0:.2f} s)")
    print(f"from disk: read records.jsonl + aggregates {t4 - t3:.2f} s + report {t5 - t4:.2f} s "
          f"= {t5 - t3:.2f} s (goal < 5 s: {(t5 - t3) / 5:.2f} of budget; CPU {c5 - c3:.2f} s)")
    print(f"report.html: {size / 1e6:.3f} MB (goal < 5 MB: {size / 5e6:.3f} of budget); "
          f"aggregates added to the export: {export_kb:.0f} KiB")


if __name__ == "__main__":
    main()
