"""Order-band width and speed on the Dynamo connector's four workloads, and on a long
closed loop of vLLM's processor cache (``--processor``).

Connector workloads (default): the four datasets of ``tests/real_engine/test_dynamo_connector.py``
(same generator arguments and seeds as its concurrency-8 cases; built here with ``mmdatagen``),
Dynamo's two tiers as bench models them there (connector 0.002 GiB, vLLM's encoder cache of 3,840
embedding tokens in front, 256 B per embedding token, Qwen2-VL's tokens per image), and a
synthetic first-come-first-served engine at concurrency 8 in place of the real one (fixed seed):
a closed loop (a session's turns one after another), arrivals 0-5 ms after sending, engine
steps of 4-10 ms with 2,048 tokens each (adjacent steps' first tokens may tie), a prefill in one step (the head of the queue waits
for a step with room), first tokens at the step's end (client jitter under 2 ms), two output
tokens. The band is the first-token band bench reports (``fcfs_windows``, releases in the first
token's step); the engine's own hits (its true order replayed) are checked to lie inside.

    python benchmarks/bench_band.py [--budget N] [--processor]
"""
from __future__ import annotations

import argparse
import hashlib
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import orjson
from PIL import Image

from mmdatagen.caches import get_target, make_cache
from mmdatagen.io.imageref import entry_size
from mmdatagen.loadgen.band import SEARCH_BUDGET, fcfs_windows, order_band
from mmdatagen.vlm import get_model

CAPACITY_GB, FRONT_TOKENS, BYTES_PER_TOKEN = 0.002, 3840, 256
STEP_TOKENS, TEXT_TOKENS = 2048, 16
MIXED = "640x480:2,320x240:1,224x224:1"
WORKLOADS = [  # name, generator, args, seed (test_dynamo_connector's at concurrency 8), repeats
    ("pool evicting, 640x480", "pool", ["-n", "60", "--pool-size", "30", "--images-per-request",
                                        "1", "--reuse", "uniform", "--image-size", "640x480"],
     708, False),
    ("sliding-window sessions", "sliding-window",
     ["--users", "4", "--turns", "6", "--window", "3", "--shared-fraction", "0.34",
      "--image-size", "640x480"], 718, False),
    ("3 images per row, repeats", "pool", ["-n", "30", "--pool-size", "30", "--images-per-request",
                                           "3", "--reuse", "uniform", "--image-size", "640x480"],
     728, True),
    ("mixed sizes, 2 per row", "pool", ["-n", "50", "--pool-size", "50", "--images-per-request",
                                        "2", "--reuse", "uniform", "--image-size", MIXED],
     738, False),
]


def tokens(width: int, height: int) -> int:
    """Qwen2-VL's embedding tokens of an image (sides rounded to 28 pixels; small images)."""
    return max(1, round(height / 28)) * max(1, round(width / 28))


def dataset(folder: Path, generator: str, args: list[str], seed: int, repeats: bool
            ) -> tuple[list[list[tuple[str, int]]], list[str]]:
    """The rows' items (key, bytes) and session ids of one generated dataset."""
    out = folder / f"{generator}-{seed}.jsonl"
    subprocess.run([sys.executable, "-m", "mmdatagen", generator, *args, "--seed", str(seed),
                    "--text-tokens", str(TEXT_TOKENS), "--output-length", "2", "--output",
                    str(out), "--quiet", "--force"], check=True, capture_output=True)
    rows = [orjson.loads(line) for line in out.read_bytes().splitlines() if line.strip()]
    if repeats:  # every other row sends its first picture again as its last (the test's rule)
        for i, row in enumerate(rows):
            if i % 2 == 0 and len(row["images"]) >= 2:
                row["images"][-1] = row["images"][0]
    sizes: dict[str, int] = {}
    items = []
    for row in rows:
        it = []
        for ref in row["images"]:
            key = hashlib.sha1(ref.encode()).hexdigest()
            if key not in sizes:
                src = ref if not ref.startswith("data:") else _decoded(ref)
                with Image.open(src) as im:
                    sizes[key] = tokens(*im.size) * BYTES_PER_TOKEN
            it.append((key, sizes[key]))
        items.append(it)
    return items, [row.get("session_id", str(i)) for i, row in enumerate(rows)]


def _decoded(url: str):
    import base64
    import io

    return io.BytesIO(base64.b64decode(url.split(",", 1)[1]))


def engine(items: list, sessions: list[str], conc: int, step_ms: tuple[int, int] = (4, 10),
           seed: int = 0):
    """A closed loop against a one-step-prefill FCFS engine: send, first-token and end times
    (ns), and the engine's true events (lookup 0 / release 1, request) in order."""
    rng = np.random.default_rng(seed)
    n, ms = len(items), 1_000_000
    need = [TEXT_TOKENS + sum(sz // BYTES_PER_TOKEN for _, sz in it) for it in items]
    send, first, end = np.full(n, -1, np.int64), np.full(n, -1, np.int64), np.zeros(n, np.int64)
    arrive = np.zeros(n, np.int64)
    busy: set[str] = set()
    free_at: dict[str, int] = {}  # a session's next turn is sent after its last one ended
    todo, waiting, running, truth = list(range(n)), [], [], []
    t, sent_at = 0, [0] * conc  # a free slot sends at its time
    while todo or waiting or running:
        for slot in range(conc):
            nxt = next((i for i in todo if sessions[i] not in busy), None)
            if nxt is None or sent_at[slot] is None or sent_at[slot] > t:
                continue
            todo.remove(nxt)
            busy.add(sessions[nxt])
            send[nxt] = max(sent_at[slot], free_at.get(sessions[nxt], 0))
            sent_at[slot] = None
            arrive[nxt] = send[nxt] + int(rng.integers(0, 5 * ms))
            waiting.append((nxt, slot))
        waiting.sort(key=lambda e: (arrive[e[0]], e[0]))
        dur = int(rng.integers(step_ms[0] * ms, step_ms[1] * ms))
        room, done, new = STEP_TOKENS - len(running), [], []
        for i, slot in running:  # the second output token: the request ends
            end[i] = t + dur + int(rng.integers(0, 2 * ms))
            sent_at[slot] = int(end[i]) + int(rng.integers(0, ms))
            busy.discard(sessions[i])
            free_at[sessions[i]] = int(end[i]) + int(rng.integers(0, ms))
            done.append(i)
        while waiting and arrive[waiting[0][0]] <= t and need[waiting[0][0]] <= room:
            i, slot = waiting.pop(0)
            room -= need[i]
            truth.append((0, i))
            new.append((i, slot))
            first[i] = t + dur + int(rng.integers(0, 2 * ms))
        truth += [(1, i) for i, _ in new]
        running = new
        t += dur
    return send, first, end, truth


def connector_band(items: list, send, first, end, budget: int):
    """bench's first-token band (predict.py's call) and its seconds."""
    target = get_target("dynamo-connector")
    capacity = target.capacity(CAPACITY_GB)
    order = np.argsort(send, kind="stable")
    its = [items[i] for i in order]
    s, f, e = send[order], first[order], end[order]
    w = fcfs_windows(s, f, f, e, None, at_first_token=True)
    pos = np.argsort(w.lo, kind="stable")
    n = len(pos)
    assert w.later_lo is not None and w.later_hi is not None

    def factory():
        return make_cache(target, capacity, front_tokens=FRONT_TOKENS,
                          bytes_per_token=BYTES_PER_TOKEN)

    t0 = time.perf_counter()
    band = order_band(target, [its[p] for p in pos], [len(its[p]) for p in pos], capacity,
                      w.lo[pos], w.hi[pos], w.later_hi[pos], [np.ones(n), np.ones(n)],
                      factory,
                      [False] * n, budget=budget, fin_lo=w.later_lo[pos])
    secs = time.perf_counter() - t0
    t0 = time.perf_counter()  # and the band for any scheduler (predict.py's any_order)
    anyb = order_band(target, its, [len(it) for it in its], capacity, s, f, f,
                      [np.ones(n), np.ones(n)],
                      factory,
                      [False] * n, budget=budget // 4, after=band.method)
    return band, secs, w.largest, anyb, time.perf_counter() - t0


def true_hits(items: list, truth: list) -> int:
    target = get_target("dynamo-connector")
    cache = make_cache(target, target.capacity(CAPACITY_GB), front_tokens=FRONT_TOKENS,
                       bytes_per_token=BYTES_PER_TOKEN)
    hits = 0
    for kind, i in truth:
        if kind == 0:
            hits += sum(cache.lookup(i, items[i]))
        else:
            cache.finish(i)
    return hits


def connector(args: argparse.Namespace) -> None:
    print(f"Dynamo's two tiers ({CAPACITY_GB} GiB connector, {FRONT_TOKENS}-token encoder "
          f"cache), synthetic FCFS engine at concurrency {args.concurrency}, "
          f"budget {args.budget:,}")
    print(f"{'workload':<28} {'lookups':>7} {'group':>5} {'engine':>6} {'method':<13} "
          f"{'band':>9} {'width':>5} {'w/lookups':>9} {'seconds':>8}  | any order: "
          f"{'method':<13} {'band':>9} {'seconds':>8}")
    with tempfile.TemporaryDirectory() as tmp:
        for k, (name, gen, gen_args, seed, repeats) in enumerate(WORKLOADS):
            if args.only is not None and k not in args.only:
                continue
            items, sessions = dataset(Path(tmp), gen, gen_args, seed, repeats)
            send, first, end, truth = engine(items, sessions, args.concurrency, args.step_ms)
            band, secs, largest, anyb, any_secs = connector_band(items, send, first, end,
                                                                 args.budget)
            lo, hi = band.bounds[0]
            truth_hits = true_hits(items, truth)
            assert lo <= truth_hits <= hi, (name, lo, truth_hits, hi)
            lookups = sum(len(it) for it in items)
            print(f"{name:<28} {lookups:>7} {largest:>5} {truth_hits:>6} {band.method:<13} "
                  f"{f'{lo}..{hi}':>9} {hi - lo:>5} {(hi - lo) / lookups:>9.1%} {secs:>8.2f}  | "
                  f"{anyb.method:<13} {'{}..{}'.format(*anyb.bounds[0]):>9} {any_secs:>8.2f}")


# -- vLLM's processor cache, a long closed loop --------------------------------------------------
DIMS = ((512, 512), (640, 480), (1024, 1024), (224, 224))


def processor_workload(n: int, conc: int, pool: int, seed: int = 0):
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


def processor(args: argparse.Namespace) -> None:
    print(f"closed loop at concurrency {args.concurrency}, Zipf 1.0 over 2,000 images, "
          "vLLM's processor cache holding about a tenth of them")
    print(f"{'requests':>9} {'exact':>8} {'low':>8} {'high':>8} {'width':>6} {'replay s':>9} "
          f"{'band s':>8}  method")
    for n in (10_000, 30_000):
        items, s, f, target, capacity = processor_workload(n, args.concurrency, 2000)
        t0 = time.perf_counter()
        cache = make_cache(target, capacity)
        exact = sum(sum(cache.lookup(i, it)) for i, it in enumerate(items))
        t_replay = time.perf_counter() - t0
        t0 = time.perf_counter()
        band = order_band(target, items, [len(it) for it in items], capacity, s, f, None,
                          [np.ones(n)], lambda t=target, c=capacity: make_cache(t, c),
                          budget=args.budget)
        t_band = time.perf_counter() - t0
        low, high = band.bounds[0]
        assert low <= exact <= high, (low, exact, high)
        print(f"{n:>9,} {exact:>8,} {low:>8,} {high:>8,} {high - low:>6,} {t_replay:>9.2f} "
              f"{t_band:>8.2f}  {band.method}")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--concurrency", type=int, default=8)
    ap.add_argument("--budget", type=int, default=SEARCH_BUDGET, help="the search's work budget")
    ap.add_argument("--step-ms", type=lambda v: tuple(map(int, v.split(","))), default=(4, 10),
                    help="the engine's step duration range, ms")
    ap.add_argument("--only", type=lambda v: [int(x) for x in v.split(",")], default=None,
                    help="workloads by index (0-3)")
    ap.add_argument("--processor", action="store_true",
                    help="vLLM's processor cache over a long closed loop instead")
    args = ap.parse_args()
    (processor if args.processor else connector)(args)


if __name__ == "__main__":
    main()
