"""Order-band width and speed on the Dynamo connector's four workloads, and on a long
closed loop of vLLM's processor cache (``--processor``).

Connector workloads (default): the four datasets of ``tests/real_engine/test_dynamo_connector.py``
(same generator arguments and seeds as its concurrency-8 cases; built here with ``mmdatagen``),
Dynamo's two tiers as bench models them there (connector 0.002 GiB, vLLM's encoder cache of 3,840
embedding tokens in front, 256 B per embedding token, Qwen2-VL's tokens per image), and a
synthetic first-come-first-served engine at concurrency 8 in place of the real one (fixed seed):
a closed loop (a session's turns one after another), arrivals 0-5 ms after sending, engine
steps of 4-10 ms with 2,048 tokens each (adjacent steps' first tokens may tie), chunked prefill
item by item (``engine``; the ``split`` column: items looked up after their own request freed
an earlier one), first tokens at the step's end (client jitter under 2 ms), two output tokens.
The band is the first-come band bench reports for vLLM's encoder cache
(``chunked.first_come_band`` over the first-token groups); the engine's own hits (its true
order replayed, item by item) are checked to lie inside.

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
from mmdatagen.caches.entries import entry_size
from mmdatagen.loadgen.band import SEARCH_BUDGET, fcfs_windows, order_band
from mmdatagen.loadgen.chunked import CHUNKED_BUDGET, first_come_band, steps
from mmdatagen.vlm import get_model

CAPACITY_GB, FRONT_TOKENS, BYTES_PER_TOKEN = 0.002, 3840, 256
STEP_TOKENS, TEXT_TOKENS, PREFIX_TOKENS = 2048, 16, 20
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
    """A closed loop against a chunked-prefill FCFS engine, item by item as vLLM's scheduler
    goes: send, first-token and end times (ns), and the engine's true events (kind: lookup 0 /
    free 1, request, item) in order. Each step spends ``STEP_TOKENS`` on the decoding requests
    (one each), then on the prompts in arrival order (the running one first), cut wherever the
    budget ends; an item is looked up when a chunk first reaches it and freed at the end of the
    step that passes it; a prompt is ``PREFIX_TOKENS`` of text, its items, ``TEXT_TOKENS``."""
    rng = np.random.default_rng(seed)
    n, ms = len(items), 1_000_000
    spans, need = [], []
    for it in items:
        pos, mine = PREFIX_TOKENS, []
        for _, sz in it:
            mine.append((pos, pos + sz // BYTES_PER_TOKEN))
            pos += sz // BYTES_PER_TOKEN
        spans.append(mine)
        need.append(pos + TEXT_TOKENS)
    send, first, end = np.full(n, -1, np.int64), np.full(n, -1, np.int64), np.zeros(n, np.int64)
    arrive = np.zeros(n, np.int64)
    busy: set[str] = set()
    free_at: dict[str, int] = {}  # a session's next turn is sent after its last one ended
    done_tok, looked, freed = [0] * n, [0] * n, [0] * n
    todo, queue, decoding, truth = list(range(n)), [], [], []
    t, sent_at = 0, [0] * conc  # a free slot sends at its time
    while todo or queue or decoding:
        for slot in range(conc):
            nxt = next((i for i in todo if sessions[i] not in busy), None)
            if nxt is None or sent_at[slot] is None or sent_at[slot] > t:
                continue
            todo.remove(nxt)
            busy.add(sessions[nxt])
            send[nxt] = max(sent_at[slot], free_at.get(sessions[nxt], 0))
            sent_at[slot] = None
            arrive[nxt] = send[nxt] + int(rng.integers(0, 5 * ms))
            queue.append((nxt, slot))
        queue.sort(key=lambda e: (done_tok[e[0]] == 0, arrive[e[0]], e[0]))  # running first
        dur = int(rng.integers(step_ms[0] * ms, step_ms[1] * ms))
        room, ran = STEP_TOKENS - len(decoding), []
        for i, slot in decoding:  # the second output token: the request ends
            end[i] = t + dur + int(rng.integers(0, 2 * ms))
            sent_at[slot] = int(end[i]) + int(rng.integers(0, ms))
            busy.discard(sessions[i])
            free_at[sessions[i]] = int(end[i]) + int(rng.integers(0, ms))
        decoding = []
        while queue and room > 0 and arrive[queue[0][0]] <= t:
            i, slot = queue[0]
            take = min(need[i] - done_tok[i], room)
            room -= take
            top = done_tok[i] = done_tok[i] + take
            while looked[i] < len(spans[i]) and spans[i][looked[i]][0] < top:
                truth.append((0, i, looked[i]))
                looked[i] += 1
            ran.append(i)
            if top == need[i]:
                queue.pop(0)
                decoding.append((i, slot))
                first[i] = t + dur + int(rng.integers(0, 2 * ms))
        for i in ran:  # the end of the step: what the chunks passed is freed
            while freed[i] < len(spans[i]) and spans[i][freed[i]][1] <= done_tok[i]:
                truth.append((1, i, freed[i]))
                freed[i] += 1
        t += dur
    return send, first, end, truth


def connector_band(items: list, send, first, end, budget: int):
    """bench's first-come band (predict.py's: ``chunked.first_come_band`` over the first-token
    groups) and its seconds; then the band over any order (``any_order``)."""
    target = get_target("dynamo-connector")
    capacity = target.capacity(CAPACITY_GB)
    order = np.argsort(send, kind="stable")
    its = [items[i] for i in order]
    s, f = send[order], first[order]
    w = fcfs_windows(s, f, f, None, None)
    pos = np.argsort(w.lo, kind="stable")
    n = len(pos)
    groups = steps(w.lo[pos])

    def factory():
        return make_cache(target, capacity, front_tokens=FRONT_TOKENS,
                          bytes_per_token=BYTES_PER_TOKEN)

    t0 = time.perf_counter()
    got = first_come_band(groups, [its[p] for p in pos], np.ones((2, n)), factory(), budget)
    secs = time.perf_counter() - t0
    band = None if got is None else (got[1], got[0][0])
    t0 = time.perf_counter()  # and the band for any scheduler (predict.py's any_order)
    anyb = order_band(target, its, [len(it) for it in its], capacity, s, f, f,
                      [np.ones(n), np.ones(n)], factory, [False] * n, budget=SEARCH_BUDGET // 4)
    return band, secs, w.largest, anyb, time.perf_counter() - t0


def true_hits(items: list, truth: list) -> int:
    """The engine's hits in its true order, each item its own request."""
    target = get_target("dynamo-connector")
    cache = make_cache(target, target.capacity(CAPACITY_GB), front_tokens=FRONT_TOKENS,
                       bytes_per_token=BYTES_PER_TOKEN)
    hits = 0
    for kind, i, k in truth:
        if kind == 0:
            hits += sum(cache.lookup((i, k), items[i][k:k + 1]))
        else:
            cache.finish((i, k))
    return hits


def connector(args: argparse.Namespace) -> None:
    print(f"Dynamo's two tiers ({CAPACITY_GB} GiB connector, {FRONT_TOKENS}-token encoder "
          f"cache), synthetic FCFS engine at concurrency {args.concurrency}, "
          f"budget {args.budget:,}")
    print(f"{'workload':<28} {'lookups':>7} {'group':>5} {'split':>5} {'engine':>6} {'method':<14} "
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
            truth_hits = true_hits(items, truth)
            lookups = sum(len(it) for it in items)
            split = sum(1 for a, b in zip(truth, truth[1:])
                        if a[0] == 1 and b[0] == 0 and a[1] == b[1])
            method, (lo, hi) = band or ("gave up", (0, lookups))
            assert lo <= truth_hits <= hi, (name, lo, truth_hits, hi)
            print(f"{name:<28} {lookups:>7} {largest:>5} {split:>5} {truth_hits:>6} {method:<14} "
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
    ap.add_argument("--budget", type=int, default=CHUNKED_BUDGET,
                    help="the chunked search's work budget")
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
