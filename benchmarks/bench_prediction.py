"""Prediction speed for every cache target, measured in one run.

A synthetic trace (default 10 M references in requests of 1-3 images, Zipf 1.0 over 100 k
images of four sizes) is analysed for every target of ``data/caches.json`` with
``mmdatagen.analysis.analyze``: the whole curve where the policy has a one-pass answer, plus
three asked capacities. Reported: references per second for all capacities at once (goal:
2 M/s), the method used, and, on a 200 k-reference prefix, agreement with an exact replay of
the shared cache model (the simulator's implementation) at the three capacities.

    python benchmarks/bench_prediction.py [--refs 10000000] [--objects 100000]
"""
from __future__ import annotations

import argparse
import time

import numpy as np

from mmdatagen.analysis import Semantics, analyze
from mmdatagen.analysis.targets import Replay
from mmdatagen.analysis.trace import Trace
from mmdatagen.caches import get_target, target_names
from mmdatagen.vlm import get_model

DIMS = np.array([(512, 512), (640, 480), (1024, 1024), (2400, 1080)])


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


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--refs", type=int, default=10_000_000)
    ap.add_argument("--objects", type=int, default=100_000)
    args = ap.parse_args()
    model = get_model("qwen3-vl-30b-a3b")
    trace = synthetic(args.refs, args.objects)
    small = prefix(trace, min(200_000, args.refs))
    analyze(small, model, Semantics())  # load the compiled kernels once (disk cache)
    print(f"trace: {trace.ids.size:,} references in {trace.num_rows:,} requests, Zipf 1.0 over "
          f"{args.objects:,} images of {len(DIMS)} sizes; model {model.name}")
    print(f"{'target':<20} {'curve refs/s':>13} {'analyze refs/s':>15} {'seconds':>8}  "
          f"{'replay check':<13} method")
    for name in target_names():
        t = get_target(name)
        sizes, _ = trace.costs(model, target=t)
        total = int(sizes[np.unique(trace.ids)].sum())
        caps = [max(1, int(total * f)) for f in (0.01, 0.05, 0.2)]
        start = time.perf_counter()
        curve_rate = _curve_rate(t, trace, sizes)
        start = time.perf_counter()
        a = analyze(trace, model, Semantics(target=name), cache_bytes=caps)
        dt = time.perf_counter() - start
        # exact replay of the shared cache model on a prefix, at the same relative capacities
        s_sizes, _ = small.costs(model, target=t)
        s_total = int(s_sizes[np.unique(small.ids)].sum())
        s_caps = [max(1, int(s_total * f)) for f in (0.01, 0.05, 0.2)]
        fast = analyze(small, model, Semantics(target=name), cache_bytes=s_caps,
                       want_curve=False).summary["capacities"]
        replay = Replay(t, small, s_sizes)
        ok = all(int(replay.flags(c).sum()) == r["hits"] for c, r in zip(s_caps, fast))
        shown = "-" if curve_rate is None else f"{curve_rate:,.0f}"
        print(f"{name:<20} {shown:>13} {trace.ids.size / dt:>15,.0f} {dt:>8.2f}  "
              f"{'equal' if ok else 'DIFFERENT':<13} {a.summary['semantics']['method']}")
    print("curve: the hit curve for every capacity at once (one-pass policies only); analyze: "
          "that plus the curve in entries, thresholds and three asked capacities")


def _curve_rate(t, trace: Trace, sizes: np.ndarray) -> float | None:
    """References per second of the all-capacities curve alone, where one exists."""
    from mmdatagen.analysis.lru import lru_curve
    from mmdatagen.analysis.targets import request_span, set_curve, touch_required

    start = time.perf_counter()
    if t.entry == "embedding-set":
        set_curve(trace, sizes, sizes)
    elif t.touch_request_first:
        request_span(trace, sizes)
        touch_required(trace, sizes)
    elif t.eviction == "fifo" or not t.insert_on_lookup and t.eviction != "freeable":
        return None
    else:
        lru_curve(trace.ids, sizes, None, trace.ref_row, t.oversize)
    return trace.ids.size / (time.perf_counter() - start)


if __name__ == "__main__":
    main()
