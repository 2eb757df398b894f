"""Prediction speed for every cache target, measured in one run, against the 2 M references/s goal.

A synthetic trace (default 10 M references in requests of 1-3 images, Zipf 1.0 over 100 k
images of four sizes) is analysed for every target of ``data/caches.json`` with
``mmdatagen.analysis.analyze`` as ``mmdatagen analyze --curve`` runs it: the whole curve, the
thresholds (90/99/100 % of the best, in bytes and in entries) and three asked capacities.
Dynamo's two-tier targets use vLLM's encoder-cache budget rule for the model. Printed per target:
references per second on the threads the analysis uses (wall clock), its ratio to the goal, the
same on one thread (``kernels.MAX_THREADS = 1``, in the same run) and the threads' speed-up,
references per second of this process's CPU time (all threads; other load on the machine
disturbs it less), and, on a 200 k-reference prefix, whether the answers at the three
capacities equal an exact replay of the shared cache model (the simulator's implementation).

    python benchmarks/bench_prediction.py [--refs 10000000] [--objects 100000] [--targets a,b]
                                          [--no-single]
"""
from __future__ import annotations

import argparse
import os
import time

import numpy as np

from mmdatagen.analysis import Semantics, analyze, kernels
from mmdatagen.analysis.targets import Replay
from mmdatagen.analysis.trace import Trace
from mmdatagen.caches import get_target, target_names
from mmdatagen.caches.entries import front_budget
from mmdatagen.vlm import get_model

DIMS = np.array([(512, 512), (640, 480), (1024, 1024), (2400, 1080)])
GOAL = 2_000_000  # references per second, every target (issue 18)
FRACTIONS = (0.01, 0.05, 0.2)


def synthetic(refs: int, objects: int, seed: int = 0) -> Trace:
    rng = np.random.default_rng(seed)
    p = 1.0 / np.arange(1, objects + 1)
    ids = rng.choice(objects, size=refs, p=p / p.sum()).astype(np.int64)
    lens = rng.integers(1, 4, size=refs)
    lens = lens[np.cumsum(lens) <= refs]
    lens = np.r_[lens, refs - lens.sum()] if lens.sum() < refs else lens
    rows = np.repeat(np.arange(lens.size), lens)
    dims = DIMS[rng.integers(0, len(DIMS), size=objects)]
    return Trace(ids, rows, int(lens.size), dims[:, 0].copy(), dims[:, 1].copy())


def prefix(trace: Trace, refs: int) -> Trace:
    n_rows = int(trace.ref_row[refs - 1]) + 1
    keep = trace.ref_row < n_rows
    return Trace(trace.ids[keep], trace.ref_row[keep], n_rows, trace.widths, trace.heights)


def capacities(trace: Trace, sizes: np.ndarray) -> list[int]:
    total = int(sizes[np.unique(trace.ids)].sum())
    return [max(1, int(total * f)) for f in FRACTIONS]


def replay_check(name: str, small: Trace, model) -> bool:
    """The analysis at three capacities equals the shared cache model replayed exactly."""
    t = get_target(name)
    sizes, _ = small.costs(model, target=t)
    caps = capacities(small, sizes)
    fast = analyze(small, model, Semantics(target=name), cache_bytes=caps,
                   want_curve=False).summary["capacities"]
    front = front_budget(t, model)
    replay = Replay(t, small, sizes, front_tokens=front,
                    bytes_per_token=model.bytes_per_token if front else None)
    return all(int(replay.flags(c).sum()) == r["hits"] for c, r in zip(caps, fast))


def timed(trace: Trace, model, name: str, caps: list[int], threads: int) -> tuple:
    """Wall and CPU seconds of the analysis on at most ``threads`` threads, and its method."""
    kept, kernels.MAX_THREADS = kernels.MAX_THREADS, threads
    try:
        wall, cpu = time.perf_counter(), time.process_time()
        a = analyze(trace, model, Semantics(target=name), cache_bytes=caps)
        return (time.perf_counter() - wall, time.process_time() - cpu,
                a.summary["semantics"]["method"])
    finally:
        kernels.MAX_THREADS = kept


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--refs", type=int, default=10_000_000)
    ap.add_argument("--objects", type=int, default=100_000)
    ap.add_argument("--targets", default=",".join(target_names()))
    ap.add_argument("--no-single", action="store_true", help="skip the one-thread runs")
    args = ap.parse_args()
    names = [n for n in args.targets.split(",") if n]
    model = get_model("qwen3-vl-30b-a3b")
    trace = synthetic(args.refs, args.objects)
    small = prefix(trace, min(200_000, args.refs))
    # load (or, on a cold numba disk cache, compile) every kernel the timed runs use: a prefix
    # as long as the threaded paths need, whose join kernels a shorter one never calls
    for name in names:
        analyze(prefix(trace, min(kernels.PARALLEL_MIN_REFS, args.refs)), model,
                Semantics(target=name))
    load = os.getloadavg()[0] if hasattr(os, "getloadavg") else float("nan")
    n = kernels.threads(trace.ids.size)
    print(f"trace: {trace.ids.size:,} references in {trace.num_rows:,} requests, Zipf 1.0 over "
          f"{args.objects:,} images of {len(DIMS)} sizes; model {model.name}; "
          f"{os.cpu_count()} CPUs, the analysis uses {n} threads; load average {load:.1f} at "
          "the start")
    print(f"{'target':<20} {'refs/s':>11} {'x goal':>7} {'1 thread':>11} {'x goal':>7} "
          f"{'speed-up':>8} {'CPU refs/s':>11} {'seconds':>8}  {'replay check':<13} method")
    for name in names:
        sizes, _ = trace.costs(model, target=get_target(name))
        caps = capacities(trace, sizes)  # the asked capacities: input, not analysis
        wall, cpu, method = timed(trace, model, name, caps, kernels.MAX_THREADS)
        one = wall if args.no_single else timed(trace, model, name, caps, 1)[0]
        rate, one_rate = trace.ids.size / wall, trace.ids.size / one
        ok = replay_check(name, small, model)
        print(f"{name:<20} {rate:>11,.0f} {rate / GOAL:>7.2f} {one_rate:>11,.0f} "
              f"{one_rate / GOAL:>7.2f} {one / wall:>8.2f} {trace.ids.size / cpu:>11,.0f} "
              f"{wall:>8.2f}  {'equal' if ok else 'DIFFERENT':<13} {method}")
    print(f"goal: {GOAL / 1e6:g} M references/s per target (x goal >= 1); the analysis as "
          "'analyze --curve' runs it: the whole curve, thresholds in bytes and entries, three "
          "capacities")


if __name__ == "__main__":
    main()
