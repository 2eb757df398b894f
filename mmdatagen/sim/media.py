"""Video and audio content parts in the simulator (sizing: ``io.mediaref.MediaResolver``).

``parse_body`` hands ``video_url`` and ``input_audio`` parts here. Each item becomes a
:class:`SimImage` (the engine's unit of encoder work and cache entry), so the encoder is charged
per embedding token of every modality and one cache holds images, videos and audios, as vLLM's
encoder and processor caches do. Videos are sized with the model family's video rule
(``media_tokens``: frame sampling, temporal patches, pixel budgets); audio with Qwen2-Audio's
rule (the simulated profiles are vision-language models; their audio cost is an assumption).
Keys: the decoded bytes' blake3 (vLLM hashes media bytes), the reference for the "reference"
key mode, the uuid for "uuid" mode when one is given.
"""
from __future__ import annotations

import base64
from pathlib import Path
from typing import Any

from ..io.mediaref import MediaResolver, read_local
from .errors import RequestError

MEDIA_PARTS = ("video_url", "input_audio")


def media_part(part: dict, ptype: str, resolver) -> Any:
    """One ``video_url`` / ``input_audio`` part as a SimImage (``resolver``: the request's
    ImageResolver, whose model and cache target size it)."""
    from .engine import SimImage

    media = getattr(resolver, "_media", None)
    if media is None:
        folder = Path(resolver.identify.dir or ".") if resolver.allow_paths else None
        media = resolver._media = MediaResolver(resolver.model, resolver.target, RequestError,
                                                dataset_dir=folder)
    if ptype == "video_url":
        return media.video(part, SimImage)
    return media.audio(part, SimImage)


def turn_media(turn, resolver) -> list:
    """A dataset turn's videos and audios as SimImages (virtual runs read local files)."""
    out = []
    for ref in turn.audios:
        if not ref:
            continue
        if ref[:4].lower() in ("wav,", "mp3,"):
            fmt, _, data = ref.partition(",")
        elif "://" in ref or ref.startswith("data:"):
            raise RequestError(400, "audio must be inline (wav,<base64>) or a local file")
        else:
            folder = resolver.identify.dir if resolver.allow_paths else None
            raw = read_local(ref, Path(folder or "."))
            fmt, data = Path(ref).suffix.lower().lstrip("."), base64.b64encode(raw).decode()
        out.append(media_part({"type": "input_audio", "input_audio": {"data": data, "format": fmt}},
                              "input_audio", resolver))
    for ref in turn.videos:
        if ref:
            out.append(media_part({"type": "video_url", "video_url": {"url": ref}}, "video_url",
                                  resolver))
    return out
