"""Video and audio items of one generation run: render tasks, references rows carry, manifest.

The generation pipeline (``generate.py``) drives this beside its images (its ``_render_media``
runs in the workers and writes files the way images are written): file delivery renders
every needed item once in the worker processes while rows are written; inline delivery renders
items batch by batch and keeps a bounded cache (the same eviction as inline images).

What rows carry, as AIPerf 0.13.0 reads it:
- videos: a file path (AIPerf sends ``data:video/<mp4|webm>;base64,...`` of the file's bytes),
  that data URL inline, or an http(s) URL (sent untouched);
- audios: a file path ending in .wav/.mp3 (AIPerf sends ``<fmt>,<base64>``) or that
  ``"wav,<base64>"`` string inline. AIPerf cannot send audio by URL (its chat formatter needs
  the ``<fmt>,`` prefix), so ``--delivery url`` writes audio inline.
"""
from __future__ import annotations

import base64
import uuid as uuidlib
from collections.abc import Callable
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path
from typing import Any

import blake3

from .audio import AudioFactory, AudioStyle
from .video import VideoFactory, VideoStyle

UUID_NAMESPACE = uuidlib.UUID("6f0c2f4e-3b1a-5d8e-9c7b-2a4d6e8f0a1c")
ROW_FIELD = {"video": "videos", "audio": "audios"}
FILE_PREFIX = {"video": "video_", "audio": "audio_"}

Key = tuple[str, int]  # (modality, item id)


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
    run: str = ""  # the run's id, for temporary file names (see generate._write_file)


@lru_cache(maxsize=4)
def _video_factory(style: VideoStyle, seed: int) -> VideoFactory:
    return VideoFactory(style, seed)


@lru_cache(maxsize=4)
def _audio_factory(style: AudioStyle, seed: int) -> AudioFactory:
    return AudioFactory(style, seed)


def item_meta(task: MediaTask, data: bytes) -> dict[str, Any]:
    """The manifest entry of one item (``ref`` filled in by the run)."""
    style = task.style
    if task.modality == "video":
        assert isinstance(style, VideoStyle)
        frames = style.num_frames
        return {"id": task.item_id, "modality": "video", "ref": None, "width": task.width,
                "height": task.height, "frames": frames, "fps": style.fps,
                "duration": frames / style.fps, "codec": style.codec_name,
                "container": style.container, "bytes": len(data),
                "blake3": blake3.blake3(data).hexdigest()}
    assert isinstance(style, AudioStyle)
    return {"id": task.item_id, "modality": "audio", "ref": None,
            "sample_rate": style.sample_rate, "channels": style.channels,
            "samples": style.num_samples, "duration": style.num_samples / style.sample_rate,
            "format": style.fmt, "bytes": len(data), "blake3": blake3.blake3(data).hexdigest()}


def inline_form(modality: str, style: VideoStyle | AudioStyle, data: bytes) -> str:
    """What a row holds for an inline item: a video data URL, or AIPerf's ``fmt,base64`` audio."""
    b64 = base64.b64encode(data).decode("ascii")
    if modality == "audio":
        return f"{style.extension},{b64}"
    return f"data:{style.mime};base64,{b64}"


def encode_item(task: MediaTask) -> bytes:
    if task.modality == "video":
        return _video_factory(task.style, task.seed).encode(task.item_id, task.width, task.height)
    return _audio_factory(task.style, task.seed).encode(task.item_id)


class MediaItems:
    """Video and audio items of one run: manifest entries, references, a bounded inline cache.

    ``ref_for(name)`` turns a file name into the reference rows carry (path or URL), the same
    rule as images. Attributes ``refs``/``cached_bytes``/``cache_budget`` follow the image
    cache's so the pipeline evicts both the same way.
    """

    def __init__(self, plan, styles: dict[str, VideoStyle | AudioStyle], seed: int,
                 delivery, ref_for: Callable[[str], str], cache_budget: int,
                 write_dir: Path | None = None, run: str = "") -> None:
        self.plan, self.styles, self.seed, self.delivery = plan, styles, seed, delivery
        self.write_dir = write_dir if write_dir is not None else delivery.image_dir
        self.run = run
        self.ref_for = ref_for
        self.meta: dict[Key, dict[str, Any]] = {}
        self.refs: dict[Key, str] = {}
        self.cache_budget = cache_budget
        self.cached_bytes = 0
        for modality in plan.media:
            if modality not in styles:
                raise ValueError(f"no style for {modality}")
            styles[modality].validate()

    def inline(self, modality: str) -> bool:
        """True when rows carry this modality's items inline (never a file)."""
        return self.delivery.mode == "data-url" or (modality == "audio" and self.delivery.mode == "url")

    def name(self, key: Key) -> str:
        modality, item_id = key
        return f"{FILE_PREFIX[modality]}{item_id:06d}.{self.styles[modality].extension}"

    def keys(self, row: int) -> list[Key]:
        """The items row ``row`` shows, videos first, then audios (the manifest's order)."""
        return [(m, int(i)) for m, mp in self.plan.media.items() for i in mp.ids[row]]

    def needed(self, rows: list[int]) -> list[Key]:
        return list(dict.fromkeys(k for r in rows for k in self.keys(r)))

    def task(self, key: Key) -> MediaTask:
        modality, item_id = key
        mp = self.plan.media[modality]
        w = int(mp.widths[item_id]) if mp.widths is not None else 0
        h = int(mp.heights[item_id]) if mp.heights is not None else 0
        file = None if self.inline(modality) else str(Path(self.write_dir) / self.name(key))
        return MediaTask(modality, self.styles[modality], self.seed, item_id, w, h, file, self.run)

    def file_ref(self, key: Key) -> str:
        return self.ref_for(self.name(key))

    def add(self, meta: dict[str, Any], payload: str | None) -> None:
        """Record a rendered item: its manifest entry and the reference rows will carry."""
        key = (meta["modality"], meta["id"])
        if payload is None:
            meta["ref"] = self.file_ref(key)
            self.refs[key] = meta["ref"]
        else:
            self.refs[key] = payload
            self.cached_bytes += len(payload)
        self.meta.setdefault(key, meta)

    def fields(self, row: int) -> dict[str, list[str]]:
        """The row's ``videos`` / ``audios`` lists (empty modalities left out)."""
        out: dict[str, list[str]] = {}
        for modality, mp in self.plan.media.items():
            if mp.per_row:
                out[ROW_FIELD[modality]] = [self.refs[(modality, int(i))] for i in mp.ids[row]]
        return out

    def uuid(self, key: Key) -> str:
        return str(uuidlib.uuid5(UUID_NAMESPACE, self.meta[key]["blake3"]))

    def manifest(self, rows: list[int], uuids: bool) -> dict[str, Any]:
        """The manifest's ``media`` section: per modality its items, each row's ids, uuids."""
        section: dict[str, Any] = {}
        for modality, mp in self.plan.media.items():
            keys = sorted(k for k in self.meta if k[0] == modality)
            entry = self.styles[modality]
            section[modality] = {
                "style": _style_dict(entry),
                "items": [{**self.meta[k], **({"uuid": self.uuid(k)} if uuids else {})}
                          for k in keys],
                "rows": [[int(i) for i in mp.ids[r]] for r in rows],
            }
        return section


def _style_dict(style: VideoStyle | AudioStyle) -> dict[str, Any]:
    if isinstance(style, VideoStyle):
        return {"container": style.container, "codec": style.codec_name, "fps": style.fps,
                "frames": style.num_frames, "content": style.content}
    return {"format": style.fmt, "sample_rate": style.sample_rate, "channels": style.channels,
            "duration": style.duration}
