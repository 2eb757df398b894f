"""Reuse-analysis speed, measured in one run (ratios, not absolute promises).

1. The all-capacities LRU curve on a synthetic trace (default 10 M references, Zipf 1.0 over
   100 k images of four sizes) against ONE replay of a single capacity through the shared cache
   model (``caches.model``, an OrderedDict LRU); the curve is checked against that replay.
   The insert-at-completion replay (compiled) against the same model on the same events.
2. ``mmdatagen analyze`` on the two seed datasets (manifests; images are not read), wall time of a
   fresh process including imports and the cached numba kernels.
3. ``mmdatagen analyze --no-manifest`` on an inline-base64 dataset of a few hundred MB (built in
   a temporary folder), at two sizes: wall time, MB/s and peak RSS (flat memory = streaming).

    python benchmarks/bench_analysis.py [--refs 10000000] [--objects 100000] [--big-mb 400]
"""
from __future__ import annotations

import argparse
import base64
import io
import json
import os
import resource
import subprocess
import sys
import tempfile
import time
import zlib
from pathlib import Path

import numpy as np

from mmdatagen.analysis import lru_curve
from mmdatagen.analysis.lru import required_capacity

SIZES = np.array([256, 300, 1024, 2550]) * 4096  # Qwen3-VL entries: 512^2, 640x480, 1024^2, 2400x1080


def synthetic(refs: int, objects: int, seed: int = 0) -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(seed)
    p = 1.0 / np.arange(1, objects + 1)
    ids = rng.choice(objects, size=refs, p=p / p.sum())
    return ids.astype(np.int64), rng.choice(SIZES, size=objects).astype(np.int64)


def bench_curve(refs: int, objects: int) -> None:
    ids, obj = synthetic(refs, objects)
    t = time.perf_counter()
    required_capacity(ids[:10], obj[ids[:10]], compiled=True)  # numba: load (or build) the cache
    print(f"numba kernel load/compile: {time.perf_counter() - t:.2f} s (once per process)")
    out = {}
    for oversize in ("flush", "bypass"):
        t = time.perf_counter()
        curve = lru_curve(ids, obj, oversize=oversize)
        out[oversize] = (time.perf_counter() - t, curve)
    cap = int(np.quantile(out["flush"][1].capacity, 0.5))
    t_replay, hits = _model_replay(ids, obj, cap)
    assert out["bypass"][1].at([cap])["hits"][0] == hits, "curve disagrees with the replay"
    print(f"trace: {refs:,} refs, Zipf 1.0 over {objects:,} images, entry sizes "
          f"{', '.join(f'{s / 2**20:.2f}' for s in SIZES)} MiB")
    print(f"cache-model replay, one capacity ({cap / 2**30:.2f} GiB): {t_replay:6.2f} s "
          f"{refs / t_replay / 1e6:6.2f} M refs/s   (hit rate {hits / refs:.1%}, matches curve)")
    for name, (sec, curve) in out.items():
        print(f"all-capacities curve, oversize {name:6}: {sec:6.2f} s {refs / sec / 1e6:6.2f} M refs/s"
              f"  {curve.capacity.size:,} breakpoints  = {t_replay / sec:.2f}x one replay")


def _model_replay(ids: np.ndarray, obj: np.ndarray, cap: int) -> tuple[float, int]:
    """Seconds and hits of one replay through ``caches.model`` (LRU, filled at lookup, bypass)."""
    from mmdatagen.caches.model import OrderedCache

    cache = OrderedCache(cap)
    keys, sizes = ids.tolist(), obj[ids].tolist()
    t = time.perf_counter()
    hits = 0
    for k, s in zip(keys, sizes):
        hits += cache.lookup(0, ((k, s),))[0]
    return time.perf_counter() - t, hits


def bench_completion(refs: int, objects: int, in_flight: int = 64) -> None:
    """The insert-at-completion replay (compiled, one capacity per pass) against one replay of
    the shared cache model (``caches.model``) on the same events; checked equal."""
    from mmdatagen.analysis import concurrency
    from mmdatagen.caches.model import OrderedCache

    refs = min(refs, 2_000_000)  # the Python model replay is the slow side
    ids, obj = synthetic(refs, objects)
    ev = concurrency.events(refs, in_flight)
    row_start = np.arange(refs + 1, dtype=np.int64)
    cap = int(obj.sum() // 20)
    concurrency.completion_flags(concurrency.events(10, 4), row_start[:11], ids[:10], obj, cap,
                                 compiled=True)  # load the compiled kernel
    best = float("inf")
    for _ in range(3):
        t = time.perf_counter()
        flags = concurrency.completion_flags(ev, row_start, ids, obj, cap, compiled=True)
        best = min(best, time.perf_counter() - t)
    cache = OrderedCache(cap, insert_on_lookup=False)
    keys, sizes = ids.tolist(), obj[ids].tolist()
    hits = 0
    t = time.perf_counter()
    for e in ev.tolist():
        if e >= 0:
            hits += cache.lookup(e, [(keys[e], sizes[e])])[0]
        else:
            cache.finish(~e)
    t_model = time.perf_counter() - t
    assert hits == int(flags.sum()), "the compiled replay disagrees with the cache model"
    print(f"insert at completion, {in_flight} in flight, {refs:,} refs, one capacity: compiled "
          f"{best:.3f} s {refs / best / 1e6:6.2f} M refs/s; cache model {t_model:.2f} s "
          f"= {t_model / best:.1f}x slower (hit rate {hits / refs:.1%}, equal)")


def bench_crossover() -> None:
    """Why small traces skip numba: its import + cached-kernel load vs the Python kernel."""
    code = ("import time; t = time.perf_counter(); from mmdatagen.analysis import kernels as K; "
            "K.compiled(K.stack_kernel); print(time.perf_counter() - t)")
    load = min(float(subprocess.run([sys.executable, "-c", code], capture_output=True,
                                    text=True, check=True).stdout) for _ in range(3))
    print(f"numba import + cached kernels in a fresh process: {load:.2f} s")
    required_capacity(np.zeros(2, np.int64), np.ones(2, np.int64), compiled=True)  # loaded here
    for n in (10_000, 30_000, 100_000):
        ids, obj = synthetic(n, max(n // 100, 10), seed=2)
        sizes = obj[ids]
        t = time.perf_counter()
        required_capacity(ids, sizes, compiled=False)
        py = time.perf_counter() - t
        t = time.perf_counter()
        required_capacity(ids, sizes, compiled=True)
        nb = time.perf_counter() - t
        print(f"  {n:>7,} refs: Python kernel {py:.3f} s ({n / py / 1e6:.2f} M/s), numba "
              f"{nb:.4f} s + load")


def _cli(*args: str) -> tuple[float, int, str]:
    """Wall time, peak RSS (KiB) and stdout of ``mmdatagen ...`` in a fresh process."""
    code = ("import resource, subprocess, sys, time; t = time.perf_counter(); "
            "r = subprocess.run(sys.argv[1:], capture_output=True, text=True); "
            "dt = time.perf_counter() - t; "
            "print(dt, resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss, r.returncode); "
            "sys.stderr.write(r.stderr)")
    exe = [sys.executable, "-m", "mmdatagen", *args]
    res = subprocess.run([sys.executable, "-c", code, *exe], capture_output=True, text=True)
    dt, rss, rc = res.stdout.split()
    if rc != "0":
        raise SystemExit(f"mmdatagen {' '.join(args)} failed: {res.stderr}")
    return float(dt), int(rss), res.stderr


def bench_seeds(tmp: Path) -> None:
    gen = [("A", ["pool"]), ("B", ["sliding-window"])]
    for name, cmd in gen:
        out = tmp / f"seed_{name}.jsonl"
        # manifests do not depend on pixels: solid images and word text keep this quick
        subprocess.run([sys.executable, "-m", "mmdatagen", *cmd, "-o", str(out), "--quiet",
                        "--image-content", "solid", "--tokenizer", "words", "--text-tokens", "20"],
                       check=True, capture_output=True)
        _cli("analyze", str(out), "--cache-gb", "10")  # warm the page cache and numba cache
        dt, rss, _ = _cli("analyze", str(out), "--cache-gb", "10", "--json")
        print(f"seed {name} from its manifest: {dt:.2f} s wall (fresh process), peak RSS "
              f"{rss / 1024:.0f} MB")


def _noise_png(rng: np.random.Generator, side: int) -> bytes:
    from PIL import Image

    buf = io.BytesIO()
    Image.fromarray(rng.integers(0, 256, (side, side, 3), np.uint8)).save(buf, "PNG",
                                                                          compress_level=0)
    return buf.getvalue()


def _text_chunk(text: bytes) -> bytes:
    body = b"tEXt" + b"Comment\0" + text
    return (len(body) - 4).to_bytes(4, "big") + body + zlib.crc32(body).to_bytes(4, "big")


def _big_file(path: Path, mb: int, distinct: bool, rng: np.random.Generator) -> int:
    """Rows of one inline PNG each: a pool of 40 pictures, or every row a distinct image."""
    pool = [_noise_png(rng, 512) for _ in range(40)]
    per_row = len(pool[0]) * 4 // 3 + 100
    rows = mb * 2**20 // per_row
    with path.open("w") as fh:
        for r in range(rows):
            data = pool[int(rng.integers(40))]
            if distinct:  # a tEXt chunk after IHDR: a valid PNG with its own bytes
                data = data[:33] + _text_chunk(f"row {r}".encode()) + data[33:]
            url = "data:image/png;base64," + base64.b64encode(data).decode()
            fh.write(json.dumps({"text": f"row {r}", "image": url}) + "\n")
    return rows


def bench_big(tmp: Path, big_mb: int) -> None:
    rng = np.random.default_rng(1)
    for mb, distinct in ((big_mb // 4, True), (big_mb, True), (big_mb, False)):
        path = tmp / f"big_{mb}.jsonl"
        rows = _big_file(path, mb, distinct, rng)
        size = path.stat().st_size
        dt, rss, _ = _cli("analyze", str(path), "--no-manifest", "--quiet", "--cache-gb", "1")
        kind = "every image distinct" if distinct else "pool of 40 images  "
        print(f"inline base64, no manifest, {kind}: {size / 2**20:5.0f} MB, {rows:,} rows in "
              f"{dt:5.2f} s ({size / 2**20 / dt:4.0f} MB/s), peak RSS {rss / 1024:.0f} MB")
        path.unlink()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--refs", type=int, default=10_000_000)
    ap.add_argument("--objects", type=int, default=100_000)
    ap.add_argument("--big-mb", type=int, default=400)
    ap.add_argument("--skip", nargs="*", default=[], choices=["curve", "completion", "crossover", "seeds",
                                                                 "big"])
    args = ap.parse_args()
    print(f"machine: {os.cpu_count()} cores, load average {os.getloadavg()[0]:.2f}")
    if "curve" not in args.skip:
        bench_curve(args.refs, args.objects)
    if "completion" not in args.skip:
        bench_completion(args.refs, args.objects)
    if "crossover" not in args.skip:
        bench_crossover()
    with tempfile.TemporaryDirectory(prefix="bench_analysis_") as tmp:
        if "seeds" not in args.skip:
            bench_seeds(Path(tmp))
        if "big" not in args.skip:
            bench_big(Path(tmp), args.big_mb)
    print(f"benchmark peak RSS {resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024:.0f} MB")


if __name__ == "__main__":
    main()
