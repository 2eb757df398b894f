"""A vLLM 0.32 fault our workloads expose: HTTP 500 "Expected a cached item for mm_hash=...".

The API server keeps the processor cache's sender side (an LRU of item sizes mirroring the engine
core's). For each request it first asks which items are cached (``is_cached``), touches those,
then walks the items in order (``get_and_update_item``): a cached item is a hit, a missing one is
inserted, evicting least recent entries until it fits. When one request's images together exceed
the cache, inserting an earlier missing image can evict a later image of the same request that
was judged cached a moment before; reaching it, the sender finds neither the entry nor data and
fails an assertion (vllm/multimodal/cache/lru.py). The request is answered 500 after
preprocessing: its lookups up to the failing item are counted in ``vllm:mm_cache_*`` (the
failing one a miss, not inserted), the items after it are never looked up, and the engine core
never sees the request (no encoder run).

Workload: sliding-window sessions, 6 users x 5 turns, window 3, 320x240 and 800x600 images
mixed, on the shared server (``--mm-processor-cache-gb 0.005``: two 800x600 entries do not fit
together), concurrency 1 (bench then sends each session's turns in a row), ``--reset-cache``
first (the shared server's caches hold earlier tests' images). It is the workload that showed
the fault (320x240 and 640x480 under 0.003 GiB) scaled to the shared cache: the sender replay
gives both the same 6 faults and 26 hits. After it the processor cache is reset again, so the
mirrors it put out of step cannot reach a later test.

Checked: the failed requests are exactly those an independent replay of the sender predicts;
the engine's counters equal that replay's (hits and queries, the failed requests' partial
lookups included); encoder runs equal the encoder-cache replay of the successful requests at
the budget mmdatagen derives for the server's flags; bench classifies the failures as an engine
fault (export ``engine_faults``, console naming the bug); bench's prediction counts what the
engine counted.
"""
from __future__ import annotations

import time
from collections import OrderedDict
from collections.abc import Iterator
from pathlib import Path

import orjson
import pytest

from .engine import RESULTS, SERVER, TIMINGS
from .reference import (
    GIB,
    Item,
    encoder_runs,
    processor_entry_bytes,
    requests_in_dispatch_order,
)
from .test_vllm_conformance import mmdatagen

pytestmark = pytest.mark.real_engine

CACHE_GB = SERVER["processor_cache_gb"]
WORKLOAD = ["--users", "6", "--turns", "5", "--window", "3", "--image-size", "320x240:1,800x600:1",
            "--seed", "7", "--text-tokens", "16", "--output-length", "2"]
FAULT_MESSAGE = "Expected a cached item for mm_hash="
BUG_NAME = "vLLM processor-cache mirror bug"
KNOWN_FAULT = "vllm-mm-cache-mirror"


def sender_replay(requests: list[list[Item]], capacity: float) -> list[dict]:
    """vLLM 0.32's API-server processor cache (``LruKeyReplicatedSenderCache`` driven by
    ``_merge_mm_kwargs``), per request: queries and hits as ``vllm:mm_cache_*`` counts them,
    and the index of the item whose assertion fails (None: the request passes)."""
    cache: OrderedDict[str, int] = OrderedDict()
    used = 0
    out = []
    for items in requests:
        judged_cached = [it.key in cache for it in items]  # is_cached(), before any change
        for it in items:  # touch_sender_cache_item
            if it.key in cache:
                cache.move_to_end(it.key)
        row: dict = {"queries": 0, "hits": 0, "fault": None}
        for i, it in enumerate(items):
            row["queries"] += 1  # LRUCache.get counts every lookup
            if it.key in cache:
                cache.move_to_end(it.key)
                row["hits"] += 1
                continue
            if judged_cached[i]:  # no entry and no data: the assertion fails, the walk stops
                row["fault"] = i
                break
            size = processor_entry_bytes(it)
            if size > capacity:  # cache_if_fits: too large for the whole cache, not inserted
                continue
            while used + size > capacity:
                _, old = cache.popitem(last=False)
                used -= old
            cache[it.key] = size
            used += size
        out.append(row)
    return out


@pytest.fixture(scope="module")
def mirror_run(vllm_server, tiny_model: Path, tmp_path_factory) -> Iterator[dict]:
    """One bench run of the workload (console kept), with the engine's counters and log."""
    tmp = tmp_path_factory.mktemp("mirror")
    dataset, out = tmp / "data.jsonl", tmp / "bench"
    mmdatagen("sliding-window", *WORKLOAD, "--output", dataset, "--quiet", "--force")
    before = vllm_server.mm_cache_counters()
    offset = vllm_server.settled_offset()
    started = time.monotonic()
    proc = mmdatagen("bench", "--input-file", dataset, "--url", vllm_server.url,
                     "--model", tiny_model, "--concurrency", 1, "--output-dir", out,
                     "--cache", "vllm-processor", "--cache-size", CACHE_GB, "--reset-cache",
                     "--extra-inputs", "ignore_eos:true",
                     "--extra-inputs", "skip_special_tokens:false")
    TIMINGS["mirror-bug bench"] = time.monotonic() - started
    end = vllm_server.settled_offset()
    after = vllm_server.mm_cache_counters()
    records = [orjson.loads(line) for line in (out / "records.jsonl").read_bytes().splitlines()]
    dispatched = requests_in_dispatch_order(dataset, records)
    replay = sender_replay([items for _, items in dispatched], CACHE_GB * GIB)
    yield {
        "stdout": proc.stdout,
        "export": orjson.loads((out / "profile_export_mmdatagen.json").read_bytes()),
        "records": records, "dispatched": dispatched, "replay": replay,
        "engine": {"hits": int(after["hits"] - before["hits"]),
                   "queries": int(after["queries"] - before["queries"])},
        "encoder_runs": vllm_server.encoder_runs(offset, end)["encoder_inputs"],
    }
    assert vllm_server.post("/reset_mm_cache") == 200  # both mirrors empty again


def test_engine_fails_exactly_where_the_sender_replay_says(mirror_run, tiny_model):
    from mmdatagen.media_tokens import encoder_cache_budget
    from mmdatagen.vlm import resolve_model

    replay, dispatched = mirror_run["replay"], mirror_run["dispatched"]
    failed = {r["metadata"]["x_request_id"]: r for r in mirror_run["records"] if r["error"]}
    predicted = [xid for (xid, _), row in zip(dispatched, replay) if row["fault"] is not None]
    ok = [items for (xid, items), row in zip(dispatched, replay) if row["fault"] is None]
    budget = encoder_cache_budget(resolve_model(path=tiny_model),
                                  SERVER["max_num_batched_tokens"],
                                  {"image": SERVER["max_images"], "video": SERVER["max_videos"]},
                                  SERVER["max_model_len"])
    row = {"workload": "mirror bug: sliding-window 6x5, window 3, 320x240+800x600",
           "concurrency": 1, "processor_cache_bytes": int(CACHE_GB * GIB),
           "references": sum(len(items) for _, items in dispatched),
           "reference_hits": sum(r["hits"] for r in replay), "reference_hits_server_order": None,
           "bench_predicted_hits": (mirror_run["export"]["image_cache"].get("predicted") or {})
           .get("hits"), "bench_predicted_cache": "vllm-processor",
           "engine_hits": mirror_run["engine"]["hits"],
           "engine_queries": mirror_run["engine"]["queries"],
           "engine_faults": len(failed), "reference_faults": len(predicted),
           "encoder_runs": mirror_run["encoder_runs"],
           "reference_encoder_runs": sum(encoder_runs(ok, budget))}
    RESULTS.append(row)

    assert predicted, "the workload no longer triggers the fault in the replay"
    assert sorted(failed) == sorted(predicted), row
    for rec in failed.values():
        assert rec["metadata"]["http_status"] == 500, rec
        assert rec["error"]["message"].startswith(FAULT_MESSAGE), rec["error"]
    # the failed requests were preprocessed: their lookups up to the failing item are counted
    assert mirror_run["engine"] == {"hits": row["reference_hits"],
                                    "queries": sum(r["queries"] for r in replay)}, row
    assert mirror_run["engine"]["queries"] < row["references"]  # the rest never looked up
    # ... and never reached the engine core
    assert mirror_run["encoder_runs"] == row["reference_encoder_runs"], row


def test_bench_names_the_fault(mirror_run):
    """bench's engine-fault class: the export's ``engine_faults`` block and the console line."""
    n = sum(1 for row in mirror_run["replay"] if row["fault"] is not None)
    faults = mirror_run["export"].get("engine_faults")
    assert faults is not None, "bench exports no engine_faults block"
    assert faults["count"] == n and faults["statuses"] == {"500": n}, faults
    assert faults["first_message"].startswith(FAULT_MESSAGE), faults
    assert faults["known"] == {KNOWN_FAULT: n}, faults
    assert BUG_NAME in mirror_run["stdout"], mirror_run["stdout"][-2000:]


def test_prediction_counts_what_the_engine_counted(mirror_run):
    """Bench's processor-cache prediction counts the failed requests as the engine did: their
    lookups up to the failing item (which misses and is not inserted), none after it (the
    model's ``stale_fault``, on for a real engine), and predicts which requests fail."""
    pred = mirror_run["export"]["image_cache"]["predicted"]
    assert pred["cache"] == "vllm-processor", pred
    assert (pred["hits"], pred["references"]) == (mirror_run["engine"]["hits"],
                                                  mirror_run["engine"]["queries"]), pred
    assert pred["band"]["width"] == 0, pred  # concurrency 1: the order is known
    n = sum(1 for row in mirror_run["replay"] if row["fault"] is not None)
    assert pred.get("faults") == {KNOWN_FAULT: n}, pred  # which requests fail, predicted
    assert f"predicted engine faults: {n} requests fail inside the engine" in \
        mirror_run["stdout"], mirror_run["stdout"][-2000:]
