"""Predicted vs measured through NVIDIA Dynamo's whole stack: Dynamo's HTTP frontend routing to an
aggregated ``dynamo.vllm`` worker with the multimodal embedding cache, on the CPU engine (vLLM
0.31, tiny Qwen2-VL; ``setup_dynamo_stack.py``, ``dynamo_stack.py``).

One stack serves every case; each case's dataset has its own seed, so its pictures are new to both
tiers and every earlier entry is older than all of them (the cold-cache argument of conftest.py).
Each case runs ``mmdatagen bench --url <frontend> --metrics-url <worker> --cache dynamo-embedding
--cache-size G --encoder-budget N`` (N as the worker logged it) and checks:

- the counters bench scraped (``dynamo_component_embedding_cache_*`` at the worker's system port,
  deltas) == this test's own scrape;
- encoder runs (the worker's ``encoder inputs: N`` iteration lines) == Dynamo's misses: an item
  vLLM's encoder cache misses is loaded on a Dynamo hit and encoded on a Dynamo miss;
- concurrency 1: bench's prediction (hits, misses) == Dynamo's counters, and an independent replay
  of the two tiers (below) == Dynamo's hits, misses and evictions;
- concurrency 8: the server's order is unknown to the client; the counters lie inside the
  export's order band (``predicted.band``: the lowest and highest hits over every order
  consistent with the client's timings; for vLLM's encoder cache in front, item by item with
  prefills chunked over steps, ``loadgen/chunked.py``), and bench's own ``measured_inside``
  agrees;
- every case: mmdatagen's two-tier model driven by the engine's own item-level cache events
  (the scheduler's lookups and frees, written by ``dynamo_stack_hook/sitecustomize.py`` under
  ``MMDATAGEN_EC_TRACE``) decides each event as the engine did and counts Dynamo's hits and
  misses. At concurrency 8 the trace shows items looked up after their own request freed an
  earlier one: prefills span steps (what broke the band's earlier one-step assumption).

The re-encoded case sends the same pixels as two different PNG files: Dynamo's worker keys an item
by its decoded pixels, so the copy is one entry (a hit in Dynamo's tier once vLLM's encoder cache
has let it go), where a key over the file bytes would see a new one.

Independent replay (concurrency 1, shares nothing with mmdatagen's cache models): vLLM's encoder
cache in front (token budget; a request's items are pinned until it finishes, then freeable in
release order, evicted oldest first when room is needed; a repeat inside a request is free), and
only its misses reach Dynamo's LRU over bytes (present: a hit, moved to most recent; absent: a
miss, saved, least recent evicted to fit; an item larger than the capacity is not saved).
"""
from __future__ import annotations

import hashlib
import subprocess
import sys
import time
from collections import OrderedDict
from pathlib import Path

import orjson
import pytest

from . import servers, setup_dynamo_stack
from .conftest import ARTIFACTS
from .dynamo_stack import DynamoStack
from .engine import OTHER_CORE, RESULTS, TIMINGS, prediction_band, read_run
from .reference import item_tokens, requests_in_dispatch_order

pytestmark = pytest.mark.real_engine

CAPACITY_GB = 0.002  # 2,147,483 B: 21 embeddings of a 640x480 image (391 tokens x 256 B)
STACK = {"capacity_gb": CAPACITY_GB, "max_num_batched_tokens": 2048, "max_images": 3}
BYTES_PER_EMBED = 256  # hidden 128 x bfloat16: the worker logs it ("bytes_per_embed=256")
GIB = 1 << 30
# the scheduler's item-level cache events (``dynamo_stack_hook/sitecustomize.py``)
TRACE = ARTIFACTS / "dynamo-ec-trace.jsonl"

WORKLOADS = [
    # name, generator, generator args, concurrency
    ("pool evicting, 640x480", "pool",
     ["-n", "60", "--pool-size", "22", "--images-per-request", "1", "--reuse", "uniform",
      "--image-size", "640x480", "--seed", "601"], 1),
    ("pool evicting, 2 mixed sizes per request", "pool",
     ["-n", "40", "--pool-size", "24", "--images-per-request", "2", "--reuse", "zipf",
      "--image-size", "640x480:2,224x224:1", "--seed", "602"], 8),
    # at concurrency 1 a session's turns run back to back and its own repeats stay in vLLM's
    # encoder cache: a third of each window from one sequence common to all users reaches
    # Dynamo's tier after other sessions' pictures
    ("sliding-window sessions, shared third", "sliding-window",
     ["--users", "5", "--turns", "5", "--window", "3", "--shared-fraction", "0.34",
      "--image-size", "640x480", "--delivery", "path", "--seed", "603"], 1),
    ("sliding-window sessions random order", "sliding-window",
     ["--users", "8", "--turns", "4", "--window", "3", "--order", "random",
      "--image-size", "640x480:1,224x224:1", "--delivery", "path", "--seed", "604"], 8),
]


# -- the stack --------------------------------------------------------------------------------
def _stack(python: Path, model: Path) -> DynamoStack:
    # vLLM 0.31 keeps its own cache beside its venv: both versions name their model-inspection
    # cache file alike (modelinfos/...qwen2_vl...json) with their own module hash, so a shared
    # one made the other version inspect the model again in a subprocess (+15 s per start)
    cache = Path(python).parent.parent / "vllm-cache"
    TRACE.parent.mkdir(parents=True, exist_ok=True)
    TRACE.write_bytes(b"")
    return DynamoStack(python, model, ARTIFACTS, **STACK,
                       env={**OTHER_CORE, "VLLM_CACHE_ROOT": str(cache),
                            "MMDATAGEN_EC_TRACE": str(TRACE)})


servers.register("stack", setup_dynamo_stack.ensure, _stack)


@pytest.fixture(scope="module")
def stack(started):
    s = started.get("stack")
    for name, seconds in s.start_seconds.items():
        TIMINGS[f"dynamo {name} start"] = seconds
    print(f"\nDynamo frontend {s.url}, worker metrics {s.metrics_url}, logs in {ARTIFACTS}",
          file=sys.stderr)
    try:
        foreign = s.foreign_addresses()
        if foreign:
            pytest.fail(f"Dynamo's logs name addresses other than 127.0.0.1: {foreign}",
                        pytrace=False)
        yield s
    finally:
        s.stop()


def mmdatagen(*args) -> subprocess.CompletedProcess:
    proc = subprocess.run([sys.executable, "-m", "mmdatagen", *map(str, args)],
                          capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, f"mmdatagen {' '.join(map(str, args[:2]))} failed:\n{proc.stderr}"
    return proc


def run_bench(stack: DynamoStack, model: Path, dataset: Path, out: Path, concurrency: int,
              budget: int) -> tuple[dict, list[dict], dict]:
    """One bench run through the frontend: its export, its records, and what the worker
    measured (Dynamo's counter deltas, encoder runs)."""
    assert stack.alive(), "a Dynamo process died before this case"
    before = stack.embedding_counters()
    offset = stack.worker.settled_offset()
    traced = TRACE.stat().st_size
    started = time.monotonic()
    mmdatagen("bench", "--input-file", dataset, "--url", stack.url,
              "--metrics-url", stack.metrics_url, "--model", model,
              "--cache", "dynamo-embedding", "--cache-size", CAPACITY_GB, "--encoder-budget", budget,
              "--concurrency", concurrency, "--output-dir", out, "--quiet",
              # a random model may emit an end token or special tokens first: keep 2 visible tokens
              "--extra-inputs", "ignore_eos:true", "--extra-inputs", "skip_special_tokens:false")
    seconds = time.monotonic() - started
    end = stack.worker.settled_offset()
    after = stack.embedding_counters()
    measured = {k: after[k] - before[k] for k in ("hits", "misses", "evictions")}
    measured["bench_seconds"] = round(seconds, 1)
    measured["entries_before"], measured["entries_after"] = before["entries"], after["entries"]
    measured["encoder_runs"] = stack.worker.encoder_runs(offset, end)["encoder_inputs"]
    with TRACE.open("rb") as f:
        f.seek(traced)
        measured["trace"] = [orjson.loads(line) for line in f.read().splitlines() if line]
    export, records = read_run(out)
    return export, records, measured


# -- the independent two-tier replay ----------------------------------------------------------
def pixel_key(path: Path, memo: dict[Path, str]) -> str:
    """The decoded RGB pixels and their size: the same picture however it is encoded."""
    from PIL import Image

    key = memo.get(path)
    if key is None:
        with Image.open(path) as img:
            rgb = img.convert("RGB")
            key = memo[path] = hashlib.sha256(
                f"{rgb.width}x{rgb.height}:".encode() + rgb.tobytes()).hexdigest()
    return key


def replay_requests(dataset: Path, records: list[dict], key: str = "pixels"
                    ) -> list[list[tuple[str, int]]]:
    """Each request's items in dispatch order as (key, embedding tokens): the key is the
    decoded pixels (Dynamo's worker), or the file's bytes (``key="bytes"``)."""
    memo: dict[Path, str] = {}
    out = []
    for _, items in requests_in_dispatch_order(dataset, records):
        row = []
        for it in items:
            assert it.key.startswith("file:"), f"the replay reads image files, not {it.key[:12]}"
            path = Path(it.key[len("file:"):])
            k = pixel_key(path, memo) if key == "pixels" else it.key  # one file, one content
            row.append((k, item_tokens(it)))
        out.append(row)
    return out


def two_tier_replay(requests: list[list[tuple[str, int]]], budget_tokens: int,
                    capacity_bytes: int) -> dict[str, int]:
    """vLLM's encoder cache in front of Dynamo's byte LRU, one request at a time."""
    cached: dict[str, int] = {}  # front entries (tokens), pinned or freeable
    freeable: OrderedDict[str, int] = OrderedDict()  # release order
    free = budget_tokens
    lru: OrderedDict[str, int] = OrderedDict()
    used = 0
    out = {"hits": 0, "misses": 0, "evictions": 0, "front_hits": 0}
    for items in requests:
        for key, tokens in items:
            if key in cached:  # in the encoder cache, or scheduled earlier in this request
                out["front_hits"] += freeable.pop(key, None) is not None
                continue
            size = tokens * BYTES_PER_EMBED
            if key in lru:
                out["hits"] += 1
                lru.move_to_end(key)
            else:
                out["misses"] += 1
                if size <= capacity_bytes:
                    while used + size > capacity_bytes:
                        used -= lru.popitem(last=False)[1]
                        out["evictions"] += 1
                    lru[key] = size
                    used += size
            while tokens > free:
                assert freeable, "the request's items do not fit the encoder cache"
                old, old_tokens = freeable.popitem(last=False)
                del cached[old]
                free += old_tokens
            cached[key] = tokens
            free -= tokens
        last = {key: i for i, (key, _) in enumerate(items)}
        for key in sorted(last, key=last.__getitem__):  # released once the request is done
            freeable[key] = cached[key]
    out["entries"] = len(lru)
    return out


def replay_trace(trace: list[dict], budget_tokens: int) -> dict[str, int]:
    """mmdatagen's two-tier model (``caches.model.TieredCache``) driven by the engine's own
    item-level cache events, in the scheduler's order: each item its own request, looked up
    when the engine scheduled it and released when the engine freed it. Counts its outcomes,
    the events where it decided otherwise than the engine (an encoder-cache hit or not, a
    Dynamo hit or not), and the items looked up after their own request freed an earlier one
    (a prefill over several steps)."""
    from mmdatagen.caches.model import TieredCache

    cache = TieredCache(int(CAPACITY_GB * GIB), budget_tokens, BYTES_PER_EMBED)
    out = {"hits": 0, "misses": 0, "disagreements": 0, "after_own_free": 0}
    freed: set[str] = set()
    for e in trace:
        rid = (e["request"], e["index"])
        if e["kind"] == "free":
            cache.finish(rid)
            freed.add(e["request"])
        elif e["kind"] in ("front", "alloc"):
            hit = cache.lookup(rid, [(e["key"], e["embeds"] * BYTES_PER_EMBED)])[0]
            served = cache.last_front[0]
            out["disagreements"] += served != (e["kind"] == "front") or (
                not served and hit != e["dynamo"])
            out["after_own_free"] += e["request"] in freed
            if not served:
                out["hits" if hit else "misses"] += 1
    return out


def summary_row(name: str, concurrency: int, pred: dict, measured: dict, reference: dict,
                budget: int) -> dict:
    """The case's row in the suite's summary (conftest's columns, Dynamo's counters beside)."""
    band = prediction_band(pred)
    exact = concurrency == 1  # the replay runs the requests one at a time
    cache = pred.get("cache")
    if band is not None:
        cache = f"{cache}; band {band['low']}..{band['high']}"
    queries = measured["hits"] + measured["misses"]
    return {"workload": f"Dynamo stack: {name}", "concurrency": concurrency,
            "processor_cache_bytes": int(CAPACITY_GB * GIB), "references": queries,
            "reference_hits": reference["hits"] if exact else None,
            "reference_hits_server_order": None, "bench_predicted_hits": pred.get("hits"),
            "bench_predicted_cache": cache, "engine_hits": measured["hits"],
            "engine_queries": queries, "encoder_runs": measured["encoder_runs"],
            "reference_encoder_runs": reference["misses"] if exact else None,
            "dynamo": {k: v for k, v in measured.items() if k != "trace"},
            "bench_predicted": {k: pred.get(k) for k in ("hits", "misses")},
            "reference_dispatch_order": reference, "encoder_budget_tokens": budget,
            "band": band}


def check_one_at_a_time(row: dict, pred: dict, measured: dict, reference: dict) -> None:
    """Concurrency 1: bench's prediction and the replay equal Dynamo's counters."""
    assert (pred["hits"], pred["misses"]) == (measured["hits"], measured["misses"]), row
    assert (reference["hits"], reference["misses"]) == (measured["hits"], measured["misses"]), row
    # earlier cases' entries are older than all of this case's, so they go first: the
    # evictions are the replay's (from an empty tier) plus those of the earlier entries that
    # are gone by the end (the entries gauge tells how many are left)
    earlier_gone = measured["entries_before"] - (measured["entries_after"] - reference["entries"])
    assert 0 <= earlier_gone <= measured["entries_before"], row
    assert measured["evictions"] == reference["evictions"] + earlier_gone, row
    if row["band"] is not None:  # the order is known: the band is a point
        assert row["band"]["low"] == row["band"]["high"] == measured["hits"], row


def check_and_record(name: str, concurrency: int, export: dict, measured: dict,
                     reference: dict, budget: int) -> dict:
    """The checks every case shares; the row goes to the suite's summary first."""
    pred = export["image_cache"]["predicted"]
    scraped = export["image_cache"]["server_metrics"]
    row = summary_row(name, concurrency, pred, measured, reference, budget)
    RESULTS.append(row)
    assert (pred.get("cache"), pred.get("keying")) == ("dynamo-embedding", "pixels"), pred
    assert scraped is not None and scraped["source"] == "dynamo_component_embedding_cache_*", scraped
    assert (scraped["hits"], scraped["queries"], scraped["evictions"]) == (
        measured["hits"], measured["hits"] + measured["misses"], measured["evictions"]), row
    assert measured["encoder_runs"] == measured["misses"], row
    # the model in the engine's own item order: Dynamo's counts, event by event
    replayed = row["engine_order_replay"] = replay_trace(measured["trace"], budget)
    assert replayed["disagreements"] == 0, row
    assert (replayed["hits"], replayed["misses"]) == (measured["hits"], measured["misses"]), row
    band = row["band"]
    if concurrency == 1:
        check_one_at_a_time(row, pred, measured, reference)
    elif band is not None:
        assert band["low"] <= measured["hits"] <= band["high"], row
    if band is not None and band["measured_inside"] is not None:  # bench's own verdict
        assert band["measured_inside"] is True, row
    return row


# -- the cases --------------------------------------------------------------------------------
@pytest.mark.parametrize("name,generator,gen_args,concurrency", WORKLOADS,
                         ids=[w[0] for w in WORKLOADS])
def test_predicted_equals_dynamo(stack, tiny_model, tmp_path, name, generator, gen_args,
                                 concurrency):
    dataset = tmp_path / "data.jsonl"
    mmdatagen(generator, *gen_args, "--text-tokens", "16", "--output-length", "2",
              "--output", dataset, "--quiet", "--force")
    budget = stack.encoder_budget()
    export, records, measured = run_bench(stack, tiny_model, dataset, tmp_path / "bench",
                                          concurrency, budget)
    reference = two_tier_replay(replay_requests(dataset, records), budget,
                                int(CAPACITY_GB * GIB))
    check_and_record(name, concurrency, export, measured, reference, budget)
    if concurrency == 1:  # the workload reaches Dynamo's tier and shows its LRU
        assert measured["hits"] > 0 and measured["misses"] > 0, measured


def test_reencoded_copies_are_one_entry(stack, tiny_model, tmp_path):
    """Ten pictures saved as PNG at compression level 1, then the same pixels at level 9 (other
    bytes); then two pairs with the copy right after its original. Dynamo's worker keys by the
    decoded pixels: each level-9 copy of the first ten is a Dynamo hit (vLLM's encoder cache, 9
    such pictures deep, has let the original go), a copy right after its original is served by
    the encoder cache. A key over the file bytes would count 24 misses and no hit."""
    import numpy as np
    from PIL import Image

    rng = np.random.default_rng(605)
    pictures = [Image.fromarray(rng.integers(0, 256, (48, 64, 3), dtype=np.uint8)).resize(
        (640, 480), Image.NEAREST) for _ in range(12)]

    def save(i: int, level: int) -> str:
        path = tmp_path / f"picture{i:02d}-png{level}.png"
        pictures[i].save(path, format="PNG", compress_level=level)
        return str(path)

    order = ([(i, 1) for i in range(10)] + [(i, 9) for i in range(10)]
             + [(10, 1), (10, 9), (11, 1), (11, 9)])
    paths = [save(i, level) for i, level in order]
    for i in range(10):
        a, b = Path(paths[i]).read_bytes(), Path(paths[10 + i]).read_bytes()
        assert a != b, "the two compression levels wrote the same bytes"
    dataset = tmp_path / "reencoded.jsonl"
    dataset.write_bytes(b"".join(
        orjson.dumps({"text": f"Describe picture {i}.", "images": [p], "output_length": 2})
        + b"\n" for (i, _), p in zip(order, paths)))

    budget = stack.encoder_budget()
    assert budget < 10 * 391, f"an encoder budget of {budget} tokens holds all ten originals"
    export, records, measured = run_bench(stack, tiny_model, dataset, tmp_path / "bench", 1,
                                          budget)
    reference = two_tier_replay(replay_requests(dataset, records), budget,
                                int(CAPACITY_GB * GIB))
    by_bytes = two_tier_replay(replay_requests(dataset, records, key="bytes"), budget,
                               int(CAPACITY_GB * GIB))
    check_and_record("same pixels re-encoded (PNG levels 1 / 9)", 1, export, measured,
                     reference, budget)
    assert (measured["hits"], measured["misses"]) == (10, 12), measured
    assert (by_bytes["hits"], by_bytes["misses"]) == (0, 24), by_bytes


def test_every_address_is_loopback(stack):
    """After all the traffic: the broker's, worker's and frontend's logs name 127.0.0.1 only."""
    assert stack.alive(), "a Dynamo process died"
    assert stack.foreign_addresses() == {}, stack.foreign_addresses()
