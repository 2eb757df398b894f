"""Videos and audio clips in the analysis: their cache entries, and one cache for every modality.

Every cache target mmdatagen models holds all modalities in one cache, so the analysis puts a
dataset's images, audio clips and videos in one trace (``trace.Trace``: a modality per object)
and runs the same kernels over it; the headline counts every item, and each capacity row is
also broken down per modality. The engines, as their sources read:

- vLLM's processor cache (``vllm/multimodal/cache/lru.py``): one ``LRUCache`` keyed by each
  item's ``mm_hash``, whatever its modality; the shared-memory variant is one ring buffer.
- vLLM's encoder cache (``vllm/v1/core/encoder_cache_manager.py``): ``cached`` maps the
  ``identifier`` of every ``mm_features`` entry of a request (images, videos and audio alike)
  to its users, and its size budget counts encoder embeddings of any modality.
- Dynamo's embedding cache: an encoder-cache connector over the same vLLM ``mm_features``.
- SGLang: modelled as the simulator does, one entry per request's item set.

Within a request items come in AIPerf's order (images, audios, videos); a multi_turn request
resends its session's earlier items. Sizes follow ``media_tokens``: Qwen2.5-VL / Qwen3-VL video
rules from the model's geometry, Qwen2-Audio for audio; entries in the target's unit
(processed pixels or features for a processor cache, tokens, or tokens x bytes per token).
"""
from __future__ import annotations

from typing import Any

import numpy as np

from ..caches.entries import clip_entry_size
from ..errors import SpecError, UserError
from ..media_tokens import (
    QWEN2_AUDIO,
    AudioCost,
    VideoCost,
    audio_cost,
    model_video_geometry,
    video_cost,
)
from ..vlm import VisionModel

MODALITIES = ("image", "audio", "video")  # codes of Trace.modality; AIPerf's order of parts
IMAGE, AUDIO, VIDEO = range(3)
COUNTS = ("hits", "hit_bytes", "hit_tokens")  # per-modality counts at a capacity


def modal_key(modality: str, count: str) -> str:
    """The key of one modality's count in the count dicts of ``predict`` (``video:hits``)."""
    return f"{modality}:{count}"


def media_costs(model: VisionModel, target, modality: np.ndarray, media: dict[str, np.ndarray],
                mask: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(entry size in the target's unit, encoder tokens) of the objects in ``mask`` (videos
    and audio clips); ``media`` holds per-object frames, fps, width, height, samples, rate."""
    idx = np.flatnonzero(mask)
    sizes = np.zeros(idx.size, np.int64)
    tokens = np.zeros(idx.size, np.int64)
    geom = None
    if (modality[idx] == VIDEO).any():
        if model.tokens_per_image is not None:
            raise SpecError("tokens_per_image", "(a generic model) has no video rule; name a "
                            "Qwen2.5-VL or Qwen3-VL model")
        geom = model_video_geometry(model)  # the video processor's own pixel limits, if any
        if geom is None:
            raise UserError(f"model family {model.family!r} has no video rule; name a "
                            "Qwen2-VL, Qwen2.5-VL or Qwen3-VL model")
    memo: dict[tuple, tuple[int, int]] = {}
    for k, i in enumerate(idx.tolist()):
        if modality[i] == VIDEO:
            key: tuple = (VIDEO, int(media["frames"][i]), float(media["fps"][i]),
                          int(media["width"][i]), int(media["height"][i]))
        else:
            key = (AUDIO, int(media["samples"][i]), int(media["sample_rate"][i]))
        if key not in memo:
            memo[key] = _cost(key, geom, model, target)
        sizes[k], tokens[k] = memo[key]
    return sizes, tokens


def _cost(key: tuple, geom, model: VisionModel, target) -> tuple[int, int]:
    cost: VideoCost | AudioCost
    if key[0] == VIDEO:
        try:
            cost = video_cost(geom, key[1], key[2] or None, key[3], key[4])
        except ValueError as exc:
            raise UserError(f"a video cannot be sized: {exc}") from None
    else:
        cost = audio_cost(QWEN2_AUDIO, key[1], key[2])
    size = clip_entry_size(target, model, cost.tokens, cost.processor_bytes)
    return max(int(size), 1), int(cost.tokens)


def _sums(mod: np.ndarray, values: np.ndarray, n: int) -> list[int]:
    """Per modality code below ``n``, the sum of ``values`` (in integers: exact past 2^53,
    where a weighted bincount's floats are not)."""
    return [int(values[mod == k].sum()) for k in range(n)]


def modal_counts(flags: np.ndarray, ref_mod: np.ndarray, ref_bytes: np.ndarray,
                 ref_tokens: np.ndarray) -> dict[str, int]:
    """Per-modality hits, hit bytes and hit tokens from per-reference hit flags."""
    n = len(MODALITIES)
    mod = ref_mod[flags]
    cols: tuple[Any, ...] = (np.bincount(mod, minlength=n), _sums(mod, ref_bytes[flags], n),
                             _sums(mod, ref_tokens[flags], n))
    return {modal_key(m, c): int(col[k]) for k, m in enumerate(MODALITIES)
            for c, col in zip(COUNTS, cols)}


def modal_totals(ids: np.ndarray, modality: np.ndarray, sizes: np.ndarray,
                 tokens: np.ndarray) -> dict[str, dict[str, int]]:
    """Per modality present: references, distinct items, bytes and tokens referenced."""
    n = len(MODALITIES)
    mod = modality[ids]
    used = np.flatnonzero(np.bincount(ids, minlength=modality.size))
    refs = np.bincount(mod, minlength=n)
    distinct = np.bincount(modality[used], minlength=n)
    byt, tok = _sums(mod, sizes[ids], n), _sums(mod, tokens[ids], n)
    return {m: {"references": int(refs[k]), "distinct": int(distinct[k]),
                "bytes": int(byt[k]), "tokens": int(tok[k])}
            for k, m in enumerate(MODALITIES) if refs[k]}


def modal_rows(counts: dict, totals: dict[str, dict[str, int]]) -> dict[str, dict[str, Any]]:
    """One capacity's per-modality block of the summary (rates of each modality's own totals)."""
    out = {}
    for m, t in totals.items():
        hits, hb, ht = (int(counts[modal_key(m, c)]) for c in COUNTS)
        out[m] = {"references": t["references"], "hits": hits,
                  "hit_rate": hits / max(t["references"], 1), "bytes_hit": hb,
                  "byte_hit_rate": hb / max(t["bytes"], 1), "tokens_saved": ht}
    return out
