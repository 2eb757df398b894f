"""Per-modality reuse of a dataset with videos and audios, in one cache for every modality.

vLLM's encoder and processor caches (and Dynamo's embedding cache) hold images, videos and
audio clips side by side, so one cache replays every item: a request's items in AIPerf's order
(images, audios, videos; multi_turn requests resend their session's history), each sized in
the target's unit (``io.imageref.entry_size`` for images, ``media_tokens`` for the rest), through
the target's own semantics (``caches.make_cache``), requests one after another (concurrency 1).
Reports references, hits, bytes and encoder tokens saved per modality. Items are keyed by
(modality, id): every manifest id is content-distinct, so this holds under every key mode.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from .caches import make_cache
from .io.imageref import entry_size, image_flags
from .io.imageref import request_items as cache_items
from .io.manifest import Manifest
from .media_tokens import (
    QWEN2_AUDIO,
    audio_processor_bytes,
    audio_tokens,
    video_cost,
    video_geometry,
)

MODALITIES = ("image", "audio", "video")  # AIPerf's order of parts within a request


@dataclass
class ModalityReuse:
    references: int = 0
    distinct: int = 0
    hits: int = 0
    bytes_referenced: int = 0
    bytes_hit: int = 0
    tokens_referenced: int = 0
    tokens_saved: int = 0

    @property
    def hit_rate(self) -> float:
        return self.hits / self.references if self.references else 0.0

    def as_dict(self) -> dict[str, Any]:
        return {"references": self.references, "distinct": self.distinct, "hits": self.hits,
                "hit_rate": self.hit_rate, "bytes_referenced": self.bytes_referenced,
                "bytes_hit": self.bytes_hit, "tokens_referenced": self.tokens_referenced,
                "tokens_saved": self.tokens_saved}


@dataclass
class MediaReuse:
    """Per-modality results of one replay (``total`` sums them)."""

    by_modality: dict[str, ModalityReuse] = field(default_factory=dict)

    @property
    def total(self) -> ModalityReuse:
        out = ModalityReuse()
        for r in self.by_modality.values():
            for name in vars(out):
                setattr(out, name, getattr(out, name) + getattr(r, name))
        return out


def item_costs(manifest: Manifest, model, target) -> dict[tuple[str, int], tuple[int, int]]:
    """(entry size in the target's unit, encoder tokens) per (modality, id)."""
    costs: dict[tuple[str, int], tuple[int, int]] = {}
    for im in manifest.images:
        costs[("image", im.id)] = (entry_size(target, model, im.width, im.height),
                                   model.image_tokens(im.width, im.height))
    media = manifest.media or {}
    geom = None
    if "video" in media:
        geom = video_geometry(model.family, model.patch_size, model.merge_size,
                              model.temporal_patch_size, model.min_pixels, model.max_pixels)
    for modality, section in media.items():
        for item in section["items"]:
            if modality == "video":
                cost = video_cost(geom, item["frames"], item["fps"], item["width"], item["height"])
                tokens, processor = cost.tokens, cost.processor_bytes
            else:
                tokens = audio_tokens(QWEN2_AUDIO, item["samples"], item["sample_rate"])
                processor = audio_processor_bytes(QWEN2_AUDIO, item["samples"], item["sample_rate"])
            size = (processor if target.entry == "processor" else
                    tokens if target.entry == "tokens" else tokens * model.bytes_per_token)
            costs[(modality, int(item["id"]))] = (size, tokens)
    return costs


def request_items(manifest: Manifest) -> list[list[tuple[str, int]]]:
    """Each request's items in order; multi_turn requests carry their session's earlier turns."""
    media = manifest.media or {}
    rows = []
    for r, image_ids in enumerate(manifest.rows):
        items = [("image", int(i)) for i in image_ids]
        for modality in ("audio", "video"):
            if modality in media:
                items += [(modality, int(i)) for i in media[modality]["rows"][r]]
        rows.append(items)
    if manifest.format != "multi_turn" or manifest.sessions is None:
        return rows
    history: dict[str, list] = {}
    out = []
    for sid, items in zip(manifest.sessions, rows):
        full = history.get(sid, []) + items
        history[sid] = full
        out.append(full)
    return out


def media_reuse(manifest: Manifest, model, target, capacity: int) -> MediaReuse:
    """Replay the dataset through one cache of ``capacity`` (in the target's unit)."""
    costs = item_costs(manifest, model, target)
    cache = make_cache(target, capacity)
    result = MediaReuse({m: ModalityReuse() for m in MODALITIES})
    seen: set = set()
    for rid, items in enumerate(request_items(manifest)):
        lookups = cache_items(target, items, [costs[key][0] for key in items])
        flags = image_flags(target, cache.lookup(rid, lookups), len(items))  # SGLang: one set
        cache.finish(rid)
        for key, hit in zip(items, flags):
            r = result.by_modality[key[0]]
            size, tokens = costs[key]
            r.references += 1
            r.bytes_referenced += size
            r.tokens_referenced += tokens
            if key not in seen:
                seen.add(key)
                r.distinct += 1
            if hit:
                r.hits += 1
                r.bytes_hit += size
                r.tokens_saved += tokens
    result.by_modality = {m: r for m, r in result.by_modality.items() if r.references}
    return result
