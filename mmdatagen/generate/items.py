"""The images, videos and audio clips of one generation run: the references rows carry (a
file path or URL, or the inline payload from a bounded cache) and the manifest entries.

What rows carry for videos and audios, as AIPerf 0.13.0 reads them:
- videos: a file path (AIPerf sends ``data:video/<mp4|webm>;base64,...`` of the file's bytes),
  that data URL inline, or an http(s) URL (sent untouched);
- audios: a file path ending in .wav/.mp3 (AIPerf sends ``<fmt>,<base64>``) or that
  ``"wav,<base64>"`` string inline. AIPerf cannot send audio by URL (its chat formatter needs
  the ``<fmt>,`` prefix), so ``--delivery url`` writes audio inline.
"""
from __future__ import annotations

import uuid as uuidlib
from collections.abc import Mapping
from dataclasses import dataclass, replace
from pathlib import Path

from ..content.audio import AudioStyle
from ..content.images import ImageFactory
from ..content.inline import InlineCache
from ..content.media import MediaTask
from ..content.video import VideoStyle
from ..errors import SpecError
from ..io.manifest import AudioStyleInfo, ImageEntry, MediaEntry, MediaSection, VideoStyleInfo
from ..plans.base import Plan
from .workers import ImageTask

DELIVERIES = ("path", "data-url", "url")
UUID_NAMESPACE = uuidlib.UUID("6f0c2f4e-3b1a-5d8e-9c7b-2a4d6e8f0a1c")
ROW_FIELD = {"video": "videos", "audio": "audios"}
FILE_PREFIX = {"video": "video_", "audio": "audio_"}

Key = tuple[str, int]  # (modality, item id)


@dataclass(frozen=True)
class Delivery:
    """How rows reference images: file paths, inline base64 data URLs, or http(s) URLs."""

    mode: str = "path"
    image_dir: Path | None = None
    path_prefix: str | None = None
    base_url: str | None = None
    uuids: bool = False

    def validate(self) -> None:
        if self.mode not in DELIVERIES:
            raise SpecError("delivery", f"must be one of {', '.join(DELIVERIES)}, got {self.mode!r}")
        if self.mode == "url" and not (self.base_url or "").startswith(("http://", "https://")):
            raise SpecError("base_url", "must start with http:// or https:// (url delivery)")

    def ref_for(self, name: str) -> str:
        """The reference rows carry for a file of the image folder (path or URL)."""
        if self.mode == "url":
            return f"{str(self.base_url).rstrip('/')}/{name}"
        prefix = self.path_prefix
        if prefix is None:
            prefix = str(self.image_dir.resolve()) if self.image_dir is not None else ""
        return f"{prefix.rstrip('/')}/{name}" if prefix else name


class ImageItems:
    """The images of one run: manifest entries, file references, a bounded inline cache.

    Files go to ``write_dir`` (a staging folder, or the shared folder of sharded runs).
    """

    def __init__(self, plan: Plan, factory: ImageFactory, delivery: Delivery, cache_budget: int,
                 write_dir: Path | None = None, run: str = "") -> None:
        self.plan, self.factory, self.delivery = plan, factory, delivery
        self.write_dir = write_dir if write_dir is not None else delivery.image_dir
        self.run = run
        self.meta: dict[int, ImageEntry] = {}
        self.files: dict[int, str] = {}  # references of images delivered as files
        self.cache: InlineCache[int] = InlineCache(cache_budget)

    @property
    def inline(self) -> bool:
        return self.delivery.mode == "data-url"

    def name(self, image_id: int) -> str:
        return f"{image_id:06d}.{self.factory.style.extension}"

    def task(self, image_id: int) -> ImageTask:
        file = None
        if not self.inline:
            if self.write_dir is None:
                raise ValueError("image files need a folder to go to")
            file = str(self.write_dir / self.name(image_id))
        return ImageTask(self.factory.style, self.factory.seed, image_id,
                     int(self.plan.widths[image_id]), int(self.plan.heights[image_id]), file,
                     self.run)

    def file_ref(self, image_id: int) -> str:
        return self.delivery.ref_for(self.name(image_id))

    def expect_files(self, ids: list[int]) -> None:
        """Rows may name these files before they are written (their references are known)."""
        self.files.update((i, self.file_ref(i)) for i in ids)

    def add(self, meta: ImageEntry, payload: str | None) -> None:
        """Record a rendered image: its manifest entry and the reference rows will carry."""
        if payload is None:
            self.files[meta.id] = self.file_ref(meta.id)
            meta = replace(meta, ref=self.files[meta.id])
        else:
            self.cache.add(meta.id, payload)
        self.meta.setdefault(meta.id, meta)

    def ref(self, image_id: int) -> str:
        """What a row carries for an image: its file reference or its data URL."""
        return self.files[image_id] if image_id in self.files else self.cache[image_id]

    def uuid(self, image_id: int) -> str:
        return str(uuidlib.uuid5(UUID_NAMESPACE, self.meta[image_id].blake3))


class MediaItems:
    """The videos and audios of one run: manifest entries, references, a bounded inline cache
    (file and inline delivery follow the images'; audio is inline under url delivery)."""

    def __init__(self, plan: Plan, styles: Mapping[str, VideoStyle | AudioStyle], seed: int,
                 delivery: Delivery, cache_budget: int, write_dir: Path | None = None,
                 run: str = "") -> None:
        self.plan, self.styles, self.seed, self.delivery = plan, dict(styles), seed, delivery
        self.write_dir = write_dir if write_dir is not None else delivery.image_dir
        self.run = run
        self.meta: dict[Key, MediaEntry] = {}
        self.files: dict[Key, str] = {}  # references of items delivered as files
        self.cache: InlineCache[Key] = InlineCache(cache_budget)
        for modality in plan.media:
            if modality not in self.styles:
                raise ValueError(f"no style for {modality}")
            self.styles[modality].validate()

    def inline(self, modality: str) -> bool:
        """True when rows carry this modality's items inline (never a file)."""
        mode = self.delivery.mode
        return mode == "data-url" or (modality == "audio" and mode == "url")

    @property
    def any_inline(self) -> bool:
        return any(self.inline(m) for m in self.plan.media)

    def name(self, key: Key) -> str:
        modality, item_id = key
        return f"{FILE_PREFIX[modality]}{item_id:06d}.{self.styles[modality].extension}"

    def keys(self, row: int) -> list[Key]:
        """The items row ``row`` shows, videos first, then audios (the manifest's order)."""
        return [(m, int(i)) for m, mp in self.plan.media.items() for i in mp.ids[row]]

    def needed(self, rows: list[int]) -> list[Key]:
        return list(dict.fromkeys(k for r in rows for k in self.keys(r)))

    def missing_inline(self, rows: list[int]) -> list[Key]:
        """Inline items ``rows`` show that the cache does not hold."""
        return [k for k in self.needed(rows) if self.inline(k[0]) and k not in self.cache]

    def task(self, key: Key) -> MediaTask:
        modality, item_id = key
        mp = self.plan.media[modality]
        w = int(mp.widths[item_id]) if mp.widths is not None else 0
        h = int(mp.heights[item_id]) if mp.heights is not None else 0
        file = None
        if not self.inline(modality):
            if self.write_dir is None:
                raise ValueError(f"{modality} files need a folder to go to")
            file = str(self.write_dir / self.name(key))
        return MediaTask(modality, self.styles[modality], self.seed, item_id, w, h, file, self.run)

    def file_ref(self, key: Key) -> str:
        return self.delivery.ref_for(self.name(key))

    def expect_files(self, keys: list[Key]) -> None:
        """Rows may name these files before they are written (their references are known)."""
        self.files.update((k, self.file_ref(k)) for k in keys)

    def add(self, meta: MediaEntry, payload: str | None) -> None:
        """Record a rendered item: its manifest entry and the reference rows will carry."""
        key = (meta.modality, meta.id)
        if payload is None:
            self.files[key] = self.file_ref(key)
            meta = replace(meta, ref=self.files[key])
        else:
            self.cache.add(key, payload)
        self.meta.setdefault(key, meta)

    def ref(self, key: Key) -> str:
        """What a row carries for an item: its file reference or its inline form."""
        return self.files[key] if key in self.files else self.cache[key]

    def fields(self, row: int) -> dict[str, list[str]]:
        """The row's ``videos`` / ``audios`` lists (empty modalities left out)."""
        out: dict[str, list[str]] = {}
        for modality, mp in self.plan.media.items():
            if mp.per_row:
                out[ROW_FIELD[modality]] = [self.ref((modality, int(i))) for i in mp.ids[row]]
        return out

    def uuid(self, key: Key) -> str:
        return str(uuidlib.uuid5(UUID_NAMESPACE, self.meta[key].blake3))

    def manifest(self, rows: list[int], uuids: bool) -> dict[str, MediaSection]:
        """The manifest's ``media`` section: per modality its items, each row's ids, uuids."""
        section: dict[str, MediaSection] = {}
        for modality, mp in self.plan.media.items():
            keys = sorted(k for k in self.meta if k[0] == modality)
            items = [replace(self.meta[k], uuid=self.uuid(k)) if uuids else self.meta[k]
                     for k in keys]
            section[modality] = MediaSection(style_info(self.styles[modality]), items,
                                             [[int(i) for i in mp.ids[r]] for r in rows])
        return section


def style_info(style: VideoStyle | AudioStyle) -> VideoStyleInfo | AudioStyleInfo:
    """What the manifest records of a style (shards of one dataset must agree on it)."""
    if isinstance(style, VideoStyle):
        return VideoStyleInfo(style.container, style.codec_name, style.fps, style.num_frames,
                              style.content)
    return AudioStyleInfo(style.fmt, style.sample_rate, style.channels, style.duration)
