"""An independent reference model of vLLM 0.32's two multimodal caches, from first principles.

It replays a benchmark's requests in their dispatch order (from the bench's ``records.jsonl``)
and says how many processor-cache hits and encoder runs vLLM should report. It shares nothing with
mmdatagen's own predictor except the dataset reader. Items are images and videos (one cache holds
both, as in vLLM); a request's images come before its videos, as the loader sends them.

Processor cache (vllm/multimodal/cache/lru.py, processing/processor.py, utils/cache.py):
- key: the client ``uuid`` when given, else the image's encoded bytes (plus model id and kwargs,
  constant here);
- entry size: the processed tensors, ``patches x 1176 + 24`` bytes for Qwen2-VL (uint8 pixels of
  3 channels x 2 frames x 14 x 14 per patch, plus the int64 grid), patches after smart_resize;
  a video's patches are its temporal groups times one frame's patches (below);
- per request: every item already present is touched first (moved to most recent), then each item
  in order is looked up (one query each; a hit moves it to most recent) and a miss inserted if it
  fits, evicting least recent entries; an item larger than the capacity is not inserted. So a
  repeat inside one request is a hit.

Videos (vllm/multimodal/video.py ``Qwen2VLVideoBackend``, the loader vLLM picks for
``Qwen2VLVideoProcessor``; transformers ``Qwen2VLVideoProcessor``):
- frames seen: ``n = total / source_fps * 2`` (the loader's fps), clamped to at least 4, at most
  ``min(768, total)`` floored to even and at most ``total``, then floored to even (a 1-frame clip
  is refused); each frame is resized by smart_resize with the *video* processor's pixel limits
  (128 x 28 x 28 and 768 x 28 x 28 for this model, not the image processor's);
- grid ``(n / 2, H' / 14, W' / 14)``, tokens = grid product / 4.

Encoder cache (vllm/v1/core/encoder_cache_manager.py, sched/scheduler.py), for concurrency 1 and
prompts that prefill in one step:
- budget in embedding tokens: ``encoder_budget`` (vllm/multimodal/encoder_budget.py); per request, items in order: a repeat of an
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

from .build_tiny_qwen2vl import (  # the tiny model's geometry
    MAX_PIXELS,
    MERGE,
    PATCH,
    TEMPORAL,
    VIDEO_MAX_PIXELS,
    VIDEO_MIN_PIXELS,
    smart_resize,
)

CHANNELS = 3
GIB = 1 << 30
LOADER_FPS = 2  # Qwen2VLVideoBackend.load_bytes(fps=2), capped at 30
MIN_FRAMES, MAX_FRAMES = 4, 768
MAX_FRAMES_PER_VIDEO = 14  # vllm/model_executor/models/qwen2_vl.py, used for the budget


@dataclass(frozen=True)
class Item:
    key: str
    width: int
    height: int
    frames: int = 0  # 0: an image; else a video's frames in its container
    fps: float = 0.0  # a video's source frame rate


def frames_seen(total: int, source_fps: float) -> int:
    """Frames of a clip the Qwen2-VL processor gets from vLLM's qwen2_vl loader."""
    cap = min(MAX_FRAMES, total) // TEMPORAL * TEMPORAL
    n = min(max(total / source_fps * min(LOADER_FPS, 30), MIN_FRAMES), cap, total)
    n = int(n // TEMPORAL) * TEMPORAL
    if n <= 0:
        raise ValueError(f"vLLM refuses a {total}-frame clip (no temporal patch)")
    return n


def patches(it: Item) -> int:
    if not it.frames:
        h, w = smart_resize(it.height, it.width)
        return (h // PATCH) * (w // PATCH)
    h, w = smart_resize(it.height, it.width, min_pixels=VIDEO_MIN_PIXELS,
                        max_pixels=VIDEO_MAX_PIXELS)
    return frames_seen(it.frames, it.fps) // TEMPORAL * (h // PATCH) * (w // PATCH)


def processor_entry_bytes(it: Item) -> int:
    return patches(it) * CHANNELS * TEMPORAL * PATCH * PATCH + 24


def item_tokens(it: Item) -> int:
    return patches(it) // (MERGE * MERGE)


def encoder_budget(max_num_batched_tokens: int, max_model_len: int, videos: bool) -> int:
    """vLLM's encoder cache size in tokens: max(batched tokens, the largest item any active
    modality can produce). For a video that is vLLM's own estimate (qwen2_vl.py
    ``get_max_video_tokens``): frames of the largest *image* size (the image processor's
    limits), as many as fit ``max_model_len`` (at most 14)."""
    unit = PATCH * MERGE
    most = MAX_PIXELS // (unit * unit)  # 1,280 merged patches; 32 x 40 keeps the ratio <= 200
    side = max(d for d in range(1, int(most ** 0.5) + 1) if most % d == 0)
    per_group = item_tokens(Item("max", unit * (most // side), unit * side))
    largest = per_group
    if videos:
        frames = 1
        while -(-(frames + 1) // TEMPORAL) * per_group <= max_model_len:
            frames += 1
        frames = min(frames, MAX_FRAMES_PER_VIDEO)
        largest = max(largest, -(-frames // TEMPORAL) * per_group)
    return max(max_num_batched_tokens, largest)


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
            size = processor_entry_bytes(it)
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
            n = item_tokens(it)
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


def _ref_bytes(ref: str, dataset_dir: Path) -> bytes:
    if ref.startswith("data:"):
        return base64.b64decode(ref.partition(",")[2])
    path = Path(ref) if Path(ref).is_absolute() else dataset_dir / ref
    return path.read_bytes()


def dims_of(ref: str, dataset_dir: Path) -> tuple[int, int]:
    from PIL import Image

    with Image.open(io.BytesIO(_ref_bytes(ref, dataset_dir))) as img:
        return img.size


def video_dims_of(ref: str, dataset_dir: Path) -> tuple[int, int, int, float]:
    """(width, height, frames, fps) from the container header (PyAV; frames counted from the
    packets when the container does not record them)."""
    import av

    with av.open(io.BytesIO(_ref_bytes(ref, dataset_dir))) as box:
        stream = box.streams.video[0]
        frames = stream.frames or sum(1 for p in box.demux(stream) if p.size)
        return stream.width, stream.height, int(frames), float(stream.average_rate)


def content_key(ref: str, dataset_dir: Path) -> str:
    """One key per distinct sent item: data URLs go out as they are, files are sent as their
    (distinct) bytes or re-encoded deterministically from distinct pixels, so the resolved path
    identifies the bytes."""
    if ref.startswith("data:"):
        return "bytes:" + hashlib.sha256(ref.encode()).hexdigest()
    path = Path(ref) if Path(ref).is_absolute() else dataset_dir / ref
    return "file:" + str(path.resolve())


def requests_in_dispatch_order(dataset: Path, records: list[dict]) -> list[tuple[str, list[Item]]]:
    """(x_request_id, items) of each request in dispatch order; history first for multi_turn."""
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
    clips: dict[str, tuple[int, int, int, float]] = {}

    def items_of(turn) -> list[Item]:
        out = []
        uuids = turn.image_uuids or []
        for i, ref in enumerate(turn.images):
            if ref not in dims:
                dims[ref] = dims_of(ref, dataset_dir)
            w, h = dims[ref]
            key = ("uuid:" + uuids[i]) if i < len(uuids) and uuids[i] else content_key(ref, dataset_dir)
            out.append(Item(key, w, h))
        for ref in turn.videos:  # after the images, as the loader sends them
            if ref not in clips:
                clips[ref] = video_dims_of(ref, dataset_dir)
            w, h, frames, fps = clips[ref]
            out.append(Item(content_key(ref, dataset_dir), w, h, frames, fps))
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
