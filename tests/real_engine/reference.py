"""An independent reference model of vLLM 0.32's two multimodal caches, from first principles.

It replays a benchmark's requests in their dispatch order (from the bench's ``records.jsonl``)
and says how many processor-cache hits and encoder runs vLLM should report. It shares nothing with
mmdatagen's own predictor except the dataset reader.

Processor cache (vllm/multimodal/cache/lru.py, processing/processor.py, utils/cache.py):
- key: the client ``uuid`` when given, else the image's encoded bytes (plus model id and kwargs,
  constant here);
- entry size: the processed tensors, ``patches x 1176 + 24`` bytes for Qwen2-VL (uint8 pixels of
  3 channels x 2 frames x 14 x 14 per patch, plus the int64 grid), patches after smart_resize;
- per request: every item already present is touched first (moved to most recent), then each item
  in order is looked up (one query each; a hit moves it to most recent) and a miss inserted if it
  fits, evicting least recent entries; an item larger than the capacity is not inserted. So a
  repeat inside one request is a hit.

Encoder cache (vllm/v1/core/encoder_cache_manager.py, sched/scheduler.py), for concurrency 1 and
prompts that prefill in one step:
- budget in embedding tokens (from the server log); per request, items in order: a repeat of an
  item scheduled in this step is free; a cached item is a hit (leaves the freeable list); else it
  needs its tokens plus those already scheduled this step in free slots, evicting freeable entries
  oldest first, and runs the encoder;
- after the prefill step the request's items are released in input order, an item repeated in the
  request at its last occurrence, and go to the end of the freeable list.
"""
from __future__ import annotations

import base64
import hashlib
import io
from collections import OrderedDict
from dataclasses import dataclass
from pathlib import Path

from .build_tiny_qwen2vl import MERGE, PATCH, TEMPORAL, smart_resize  # the tiny model's geometry

CHANNELS = 3
GIB = 1 << 30


def patches(width: int, height: int) -> int:
    h, w = smart_resize(height, width)
    return (h // PATCH) * (w // PATCH)


def processor_entry_bytes(width: int, height: int) -> int:
    return patches(width, height) * CHANNELS * TEMPORAL * PATCH * PATCH + 24


def image_tokens(width: int, height: int) -> int:
    return patches(width, height) // (MERGE * MERGE)


@dataclass(frozen=True)
class Item:
    key: str
    width: int
    height: int


def processor_hits(requests: list[list[Item]], capacity_bytes: float) -> list[int]:
    """Hits per request of vLLM's processor cache (LRU over entry bytes)."""
    cache: OrderedDict[str, int] = OrderedDict()
    used = 0
    out = []
    for items in requests:
        for it in items:  # touch everything present before any insert
            if it.key in cache:
                cache.move_to_end(it.key)
        hits = 0
        for it in items:
            if it.key in cache:
                hits += 1
                cache.move_to_end(it.key)
                continue
            size = processor_entry_bytes(it.width, it.height)
            if size > capacity_bytes:
                continue
            while used + size > capacity_bytes:
                _, old = cache.popitem(last=False)
                used -= old
            cache[it.key] = size
            used += size
        out.append(hits)
    return out


def encoder_runs(requests: list[list[Item]], budget_tokens: int) -> list[int]:
    """Encoder runs per request (concurrency 1, each prompt prefilled in one step)."""
    tokens_of: dict[str, int] = {}
    freeable: OrderedDict[str, int] = OrderedDict()
    cached: set[str] = set()
    free = budget_tokens
    out = []
    for items in requests:
        scheduled: dict[str, int] = {}
        runs = 0
        for it in items:
            if it.key in scheduled:
                continue
            if it.key in cached:
                freeable.pop(it.key, None)  # referenced again: no longer evictable
                continue
            n = image_tokens(it.width, it.height)
            need = n + sum(scheduled.values())
            if need > free + sum(freeable.values()):
                raise AssertionError("workload needs chunked prefill: outside this reference")
            while need > free:
                old, t = freeable.popitem(last=False)
                cached.discard(old)
                free += t
            scheduled[it.key] = n
            runs += 1
        for key, n in scheduled.items():
            cached.add(key)
            tokens_of[key] = n
            free -= n
        last = {it.key: i for i, it in enumerate(items)}
        for key in sorted(last, key=last.get):
            freeable[key] = tokens_of[key]
        out.append(runs)
    return out


def dims_of(ref: str, dataset_dir: Path) -> tuple[int, int]:
    from PIL import Image

    if ref.startswith("data:"):
        data = base64.b64decode(ref.partition(",")[2])
        with Image.open(io.BytesIO(data)) as img:
            return img.size
    path = Path(ref) if Path(ref).is_absolute() else dataset_dir / ref
    with Image.open(path) as img:
        return img.size


def content_key(ref: str, dataset_dir: Path) -> str:
    """One key per distinct sent image: data URLs go out as they are, files are re-encoded
    deterministically from their (distinct) pixels, so the resolved path identifies the bytes."""
    if ref.startswith("data:"):
        return "bytes:" + hashlib.sha256(ref.encode()).hexdigest()
    path = Path(ref) if Path(ref).is_absolute() else dataset_dir / ref
    return "file:" + str(path.resolve())


def requests_in_dispatch_order(dataset: Path, records: list[dict]) -> list[tuple[str, list[Item]]]:
    """(x_request_id, images) of each request in dispatch order; history first for multi_turn."""
    from mmdatagen.io.readers import detect_format, iter_turns

    fmt = detect_format(dataset)
    dataset_dir = dataset.resolve().parent
    by_conv: dict[str, list] = {}
    for turn in iter_turns(dataset, fmt):
        conv = turn.session_id if turn.session_id is not None else f"row_{turn.line_no}"
        if fmt == "multi_turn":
            conv = turn.session_id
        by_conv.setdefault(conv, []).append(turn)
    dims: dict[str, tuple[int, int]] = {}

    def items_of(turn) -> list[Item]:
        out = []
        uuids = turn.image_uuids or []
        for i, ref in enumerate(turn.images):
            if ref not in dims:
                dims[ref] = dims_of(ref, dataset_dir)
            w, h = dims[ref]
            key = ("uuid:" + uuids[i]) if i < len(uuids) and uuids[i] else content_key(ref, dataset_dir)
            out.append(Item(key, w, h))
        return out

    ordered = sorted((r["metadata"] for r in records), key=lambda m: m["dispatch_index"])
    reqs = []
    for meta in ordered:
        turns = by_conv[meta["conversation_id"]]
        t = meta["turn_index"]
        if fmt == "multi_turn":
            items = [it for turn in turns[: t + 1] for it in items_of(turn)]
        else:
            items = items_of(turns[t])
        reqs.append((meta["x_request_id"], items))
    return reqs
