"""Video and audio render tasks: one item's style, seed, id and size -> its encoded bytes, and
the inline form rows carry (a ``data:video/...`` URL, or AIPerf's ``fmt,base64`` audio).

The generation pipeline (``generate/``) runs these in its workers beside the images.
"""
from __future__ import annotations

import base64
from dataclasses import dataclass
from functools import lru_cache

from .audio import AudioFactory, AudioStyle
from .video import VideoFactory, VideoStyle


@dataclass(frozen=True)
class MediaTask:
    """One video or audio item to render in a worker: small and cheap to pickle."""

    modality: str
    style: VideoStyle | AudioStyle
    seed: int
    item_id: int
    width: int
    height: int
    file: str | None  # write the item here; None: return its inline form
    run: str = ""  # the run's id, for temporary file names (see generate.workers)


@lru_cache(maxsize=4)
def _video_factory(style: VideoStyle, seed: int) -> VideoFactory:
    return VideoFactory(style, seed)


@lru_cache(maxsize=4)
def _audio_factory(style: AudioStyle, seed: int) -> AudioFactory:
    return AudioFactory(style, seed)


def inline_form(modality: str, style: VideoStyle | AudioStyle, data: bytes) -> str:
    """What a row holds for an inline item: a video data URL, or AIPerf's ``fmt,base64`` audio."""
    b64 = base64.b64encode(data).decode("ascii")
    if modality == "audio":
        return f"{style.extension},{b64}"
    return f"data:{style.mime};base64,{b64}"


def encode_item(task: MediaTask) -> bytes:
    if isinstance(task.style, VideoStyle):
        return _video_factory(task.style, task.seed).encode(task.item_id, task.width, task.height)
    return _audio_factory(task.style, task.seed).encode(task.item_id)
