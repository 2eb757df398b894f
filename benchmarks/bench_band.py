"""Order-band speed against the exact replay, measured in one run.

A closed-loop run at concurrency 8 is synthesised: each slot sends its next request when the
previous one ends; a request's first byte comes 20-80 ms after it was sent and its end 0-40 ms
later, so every request's window overlaps those of the other slots. Each request carries 1-3
images (Zipf 1.0 over a pool, four sizes, sized as vLLM's processor cache sizes them) and the
cache (vLLM's processor cache, touch-first LRU) holds about a tenth of the pool. Reported per
size: the exact replay in send order (the prediction's value), the band (``loadgen/band.py``:
lowest and highest hits over every arrival order the windows allow), the band's width and the
time of each, as the ratio band / replay.

    python benchmarks/bench_band.py [--requests 10000,30000,100000] [--concurrency 8]
"""
from __future__ import annotations

import argparse
import time

import numpy as np

from mmdatagen.caches import get_target, make_cache
from mmdatagen.io.imageref import entry_size
from mmdatagen.loadgen.band import order_band
from mmdatagen.vlm import get_model

DIMS = ((512, 512), (640, 480), (1024, 1024), (224, 224))


def workload(n: int, conc: int, pool: int, seed: int = 0):
    """Items per request and the (send, first byte) windows of a closed loop at ``conc``."""
    rng = np.random.default_rng(seed)
    model, target = get_model("qwen2.5-vl-7b"), get_target("vllm-processor")
    sizes = [entry_size(target, model, w, h) for w, h in DIMS]
    size_of = [sizes[k] for k in rng.integers(0, len(DIMS), size=pool)]
    p = 1.0 / np.arange(1, pool + 1)
    keys = rng.choice(pool, size=3 * n, p=p / p.sum())
    lens = rng.integers(1, 4, size=n)
    cuts = np.r_[0, np.cumsum(lens)]
    items = [[(int(k), size_of[k]) for k in keys[cuts[i]:cuts[i + 1]]] for i in range(n)]
    free = np.zeros(conc)
    s, f = np.zeros(n, np.int64), np.zeros(n, np.int64)
    for i in range(n):
        slot = int(np.argmin(free))
        s[i] = int(free[slot])
        f[i] = s[i] + int(rng.integers(20_000_000, 80_000_000))
        free[slot] = f[i] + int(rng.integers(0, 40_000_000))
    order = np.argsort(s, kind="stable")
    return [items[i] for i in order], s[order], f[order], target, sum(sorted(size_of)[:pool // 10])


def replay(target, capacity: int, items) -> int:
    cache = make_cache(target, capacity)
    return sum(sum(cache.lookup(i, it)) for i, it in enumerate(items))


def timed_band(target, capacity, items, s, f, budget=None):
    n = len(items)
    kw = {} if budget is None else {"budget": budget}
    t0 = time.perf_counter()
    band = order_band(target, items, [len(it) for it in items], capacity, s, f, None,
                      [np.ones(n)], lambda: make_cache(target, capacity), **kw)
    return band, time.perf_counter() - t0


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--requests", default="10000,30000,100000")
    ap.add_argument("--concurrency", type=int, default=8)
    ap.add_argument("--pool", type=int, default=2000)
    ap.add_argument("--tightness", type=int, default=200,
                    help="requests of the run where the exact search and the bound are compared")
    args = ap.parse_args()
    print(f"closed loop at concurrency {args.concurrency}, Zipf 1.0 over {args.pool:,} images, "
          "vLLM's processor cache holding about a tenth of them")
    print(f"{'requests':>9} {'refs':>8} {'exact':>8} {'low':>8} {'high':>8} {'width':>6} "
          f"{'replay s':>9} {'band s':>8} {'ratio':>7}  method")
    for n in map(int, args.requests.split(",")):
        items, s, f, target, capacity = workload(n, args.concurrency, args.pool)
        t0 = time.perf_counter()
        exact = replay(target, capacity, items)
        t_replay = time.perf_counter() - t0
        band, t_band = timed_band(target, capacity, items, s, f)
        low, high = band.bounds[0]
        assert low <= exact <= high, (low, exact, high)
        refs = sum(len(it) for it in items)
        print(f"{n:>9,} {refs:>8,} {exact:>8,} {low:>8,} {high:>8,} {high - low:>6,} "
              f"{t_replay:>9.2f} {t_band:>8.2f} {t_band / t_replay:>6.1f}x  {band.method}")
    n = args.tightness
    items, s, f, target, capacity = workload(n, args.concurrency, n // 2)
    capacity = sum(sorted(sz for it in items for _, sz in it)[:24])  # about 24 entries
    exact = replay(target, capacity, items)
    searched, t_search = timed_band(target, capacity, items, s, f, budget=200_000_000)
    bound, t_bound = timed_band(target, capacity, items, s, f, budget=0)
    print(f"tightness, {n} requests (Zipf over {n // 2} images, about 24 entries cached): "
          f"exact {exact}; the band by exact search {searched.bounds[0]} ({searched.method}, "
          f"{t_search:.1f} s); the stack bound {bound.bounds[0]} ({t_bound:.2f} s)")

if __name__ == "__main__":
    main()
