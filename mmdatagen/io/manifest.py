"""The sidecar manifest (``<output>.manifest.json``): parameters, images, rows, without pixels.

A manifest is bound to its JSONL: it records the file's size, line count and blake3 hash
(``jsonl``), and :func:`read_manifest` refuses one whose file does not match, so a stale or
foreign manifest (another run's, a file cut short, a hand-edited row) is never trusted. The
typed :class:`Manifest` is the one reader of the format: merge, analysis and the Hugging Face
export use its fields, not dictionary keys.
"""
from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, ClassVar, Literal

import blake3
import orjson

from ..errors import DatasetError

MANIFEST_SUFFIX = ".manifest.json"
MANIFEST_VERSION = 2  # 2: the "jsonl" binding (size, lines, blake3 of the dataset file)


@dataclass(frozen=True)
class ContentHash:
    """What a JSONL file holds: its size in bytes, its lines and its blake3 hex digest."""

    bytes: int
    lines: int
    blake3: str

    @staticmethod
    def digest_of_file(path: Path) -> str:
        """blake3 of a file (memory-mapped, every core: a few GB/s)."""
        hasher = blake3.blake3(max_threads=blake3.blake3.AUTO)
        if Path(path).stat().st_size:
            hasher.update_mmap(path)
        return hasher.hexdigest()

    def as_dict(self) -> dict[str, Any]:
        return {"bytes": self.bytes, "lines": self.lines, "blake3": self.blake3}


class HashingWriter:
    """Wraps a binary file: every write also feeds a blake3 hash and counts bytes and lines."""

    def __init__(self, fh) -> None:
        self.fh = fh
        self.hasher = blake3.blake3()
        self.size = 0
        self.lines = 0

    def write(self, data: bytes) -> int:
        self.hasher.update(data)
        self.size += len(data)
        self.lines += data.count(b"\n")
        return self.fh.write(data)

    def result(self) -> ContentHash:
        return ContentHash(self.size, self.lines, self.hasher.hexdigest())


@dataclass(frozen=True)
class ShardInfo:
    """Which part of the dataset's output lines a file holds: ``lines`` = [start, stop)."""

    index: int
    num_shards: int
    lines: tuple[int, int]
    total_lines: int

    def as_dict(self) -> dict[str, Any]:
        return {"index": self.index, "num_shards": self.num_shards,
                "lines": [self.lines[0], self.lines[1]], "total_lines": self.total_lines}


@dataclass(frozen=True)
class ImageEntry:
    """One pool image: id, reference (None for inline data URLs), size, bytes, blake3."""

    id: int
    ref: str | None
    width: int
    height: int
    bytes: int
    blake3: str

    def as_dict(self) -> dict[str, Any]:
        return {"id": self.id, "ref": self.ref, "width": self.width, "height": self.height,
                "bytes": self.bytes, "blake3": self.blake3}


Modality = Literal["video", "audio"]
MODALITIES: tuple[Modality, ...] = ("video", "audio")


@dataclass(frozen=True)
class VideoEntry:
    """One pool video: id, reference (None inline), size, frames, rate, encoding, bytes, blake3."""

    id: int
    ref: str | None
    width: int
    height: int
    frames: int
    fps: float
    duration: float
    codec: str
    container: str
    bytes: int
    blake3: str
    uuid: str | None = None  # with image uuids: uuid5 of the blake3

    modality: ClassVar[Modality] = "video"

    def as_dict(self) -> dict[str, Any]:
        d: dict[str, Any] = {
            "id": self.id, "modality": "video", "ref": self.ref, "width": self.width,
            "height": self.height, "frames": self.frames, "fps": self.fps,
            "duration": self.duration, "codec": self.codec, "container": self.container,
            "bytes": self.bytes, "blake3": self.blake3}
        if self.uuid is not None:
            d["uuid"] = self.uuid
        return d

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> VideoEntry:
        return cls(int(d["id"]), _opt_str(d.get("ref")), int(d["width"]), int(d["height"]),
                   int(d["frames"]), _number(d["fps"]), _number(d["duration"]), str(d["codec"]),
                   str(d["container"]), int(d["bytes"]), str(d["blake3"]),
                   _opt_str(d.get("uuid")))


@dataclass(frozen=True)
class AudioEntry:
    """One pool audio clip: id, reference (None inline), rate, channels, samples, bytes, blake3."""

    id: int
    ref: str | None
    sample_rate: int
    channels: int
    samples: int
    duration: float
    format: str
    bytes: int
    blake3: str
    uuid: str | None = None

    modality: ClassVar[Modality] = "audio"

    def as_dict(self) -> dict[str, Any]:
        d: dict[str, Any] = {
            "id": self.id, "modality": "audio", "ref": self.ref, "sample_rate": self.sample_rate,
            "channels": self.channels, "samples": self.samples, "duration": self.duration,
            "format": self.format, "bytes": self.bytes, "blake3": self.blake3}
        if self.uuid is not None:
            d["uuid"] = self.uuid
        return d

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> AudioEntry:
        return cls(int(d["id"]), _opt_str(d.get("ref")), int(d["sample_rate"]),
                   int(d["channels"]), int(d["samples"]), _number(d["duration"]),
                   str(d["format"]), int(d["bytes"]), str(d["blake3"]), _opt_str(d.get("uuid")))


MediaEntry = VideoEntry | AudioEntry


@dataclass(frozen=True)
class VideoStyleInfo:
    """How every video of a dataset is encoded (shards must agree on it)."""

    container: str
    codec: str
    fps: float
    frames: int
    content: str

    def as_dict(self) -> dict[str, Any]:
        return {"container": self.container, "codec": self.codec, "fps": self.fps,
                "frames": self.frames, "content": self.content}

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> VideoStyleInfo:
        return cls(str(d["container"]), str(d["codec"]), _number(d["fps"]), int(d["frames"]),
                   str(d["content"]))


@dataclass(frozen=True)
class AudioStyleInfo:
    """How every audio clip of a dataset is encoded."""

    format: str
    sample_rate: int
    channels: int
    duration: float

    def as_dict(self) -> dict[str, Any]:
        return {"format": self.format, "sample_rate": self.sample_rate,
                "channels": self.channels, "duration": self.duration}

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> AudioStyleInfo:
        return cls(str(d["format"]), int(d["sample_rate"]), int(d["channels"]),
                   _number(d["duration"]))


@dataclass(frozen=True)
class MediaSection:
    """One modality of the manifest's ``media``: its style, its items (sorted by id) and each
    row's item ids."""

    style: VideoStyleInfo | AudioStyleInfo
    items: list[MediaEntry]
    rows: list[list[int]]

    def as_dict(self) -> dict[str, Any]:
        return {"style": self.style.as_dict(), "items": [it.as_dict() for it in self.items],
                "rows": self.rows}

    @classmethod
    def from_dict(cls, modality: str, d: Any) -> MediaSection:
        if not isinstance(d, dict) or not isinstance(d["items"], list):
            raise TypeError(f"media section {modality!r} is not an object with an item list")
        rows = [[int(x) for x in row] for row in d["rows"]]
        if modality == "video":
            return cls(VideoStyleInfo.from_dict(d["style"]),
                       [VideoEntry.from_dict(it) for it in d["items"]], rows)
        if modality == "audio":
            return cls(AudioStyleInfo.from_dict(d["style"]),
                       [AudioEntry.from_dict(it) for it in d["items"]], rows)
        raise ValueError(f"unknown media modality {modality!r}")


def _number(x: Any) -> float:
    """A JSON number kept as written (an int stays an int: merged manifests keep their bytes)."""
    if isinstance(x, bool) or not isinstance(x, (int, float)):
        raise TypeError(f"{x!r} is not a number")
    return x


def _opt_str(x: Any) -> str | None:
    return None if x is None else str(x)


@dataclass
class Manifest:
    """Everything about one dataset file except pixels (see DEVELOPERS.md for the layout)."""

    kind: str
    format: str
    params: dict[str, Any]
    seed: Any
    shard: ShardInfo
    delivery: str
    images: list[ImageEntry]
    rows: list[list[int]]
    sessions: list[str] | None = None
    image_uuids: dict[str, str] | None = None
    jsonl: ContentHash | None = None
    image_format: str | None = None
    image_content: str | None = None
    text_tokens: int | None = None
    tokenizer: str | None = None
    mmdatagen_version: str = ""
    # videos and audios by modality (None for image-only datasets); written by content/media.py
    media: dict[str, MediaSection] | None = None
    extra: dict[str, Any] = field(default_factory=dict)  # keys of newer writers, kept as given

    # Key order of the file: fixed so that a merge writes the bytes one process writes.
    ORDER = ("manifest_version", "mmdatagen_version", "kind", "format", "params", "seed", "shard",
             "delivery", "image_format", "image_content", "text_tokens", "tokenizer", "jsonl",
             "images", "rows", "sessions", "image_uuids", "media")

    def to_dict(self) -> dict[str, Any]:
        d = {"manifest_version": MANIFEST_VERSION, "mmdatagen_version": self.mmdatagen_version,
             "kind": self.kind, "format": self.format, "params": self.params, "seed": self.seed,
             "shard": self.shard.as_dict(), "delivery": self.delivery,
             "image_format": self.image_format, "image_content": self.image_content,
             "text_tokens": self.text_tokens, "tokenizer": self.tokenizer,
             "jsonl": None if self.jsonl is None else self.jsonl.as_dict(),
             "images": [im.as_dict() for im in self.images], "rows": self.rows,
             "sessions": self.sessions, "image_uuids": self.image_uuids}
        if self.media is not None:
            d["media"] = {m: section.as_dict() for m, section in self.media.items()}
        return {**d, **self.extra}

    def identity(self) -> dict[str, Any]:
        """The fields every shard of one dataset shares (everything but its own part)."""
        d = self.to_dict()
        for key in ("shard", "images", "rows", "sessions", "image_uuids", "jsonl"):
            d.pop(key)
        if self.media is not None:  # shards share the styles, not the items or rows
            d["media"] = {m: section.style.as_dict() for m, section in self.media.items()}
        return d

    @classmethod
    def from_dict(cls, data: Any, source: str = "manifest") -> Manifest:
        """Parse and type-check; a malformed manifest is a one-line :class:`DatasetError`."""
        try:
            if not isinstance(data, dict):
                raise TypeError("not a JSON object")
            rows = [[int(x) for x in row] for row in data["rows"]]
            parts = _Parts(images=[_image_entry(im) for im in data["images"]], rows=rows,
                           sessions=_sessions(data.get("sessions")),
                           shard=_shard(data.get("shard"), len(rows)),
                           jsonl=_content_hash(data.get("jsonl")),
                           image_uuids=_uuids(data.get("image_uuids")),
                           media=_media(data.get("media"), len(rows)))
        except (KeyError, TypeError, ValueError, IndexError) as exc:
            raise DatasetError(f"{source}: malformed manifest ({exc.__class__.__name__}: {exc})") \
                from None
        if parts.sessions is not None and len(parts.sessions) != len(rows):
            raise DatasetError(f"{source}: manifest has {len(parts.sessions)} sessions for "
                               f"{len(rows)} rows")
        _check_lines(data.get("format") or "single_turn", parts, source)
        return cls(kind=data.get("kind") or "", format=data.get("format") or "single_turn",
                   params=data.get("params") or {}, seed=data.get("seed"), shard=parts.shard,
                   delivery=data.get("delivery") or "", images=parts.images, rows=rows,
                   sessions=parts.sessions, image_uuids=parts.image_uuids, jsonl=parts.jsonl,
                   image_format=data.get("image_format"), image_content=data.get("image_content"),
                   text_tokens=data.get("text_tokens"), tokenizer=data.get("tokenizer"),
                   mmdatagen_version=data.get("mmdatagen_version") or "", media=parts.media,
                   extra={k: v for k, v in data.items() if k not in cls.ORDER})

    def check_file(self, jsonl_path: Path, source: str) -> None:
        """Refuse a manifest that does not describe ``jsonl_path`` byte for byte."""
        path = Path(jsonl_path)
        if self.jsonl is None:
            raise DatasetError(f"{source} does not record its dataset's hash")
        size = path.stat().st_size
        want = self.jsonl
        if size != want.bytes:
            raise DatasetError(f"{source} does not belong to {path}: it describes {want.lines} "
                               f"lines and {want.bytes:,} bytes, the file has {size:,} bytes")
        got = ContentHash.digest_of_file(path)
        if got != want.blake3:
            raise DatasetError(f"{source} does not belong to {path}: same size, different "
                               f"content (blake3 {got[:12]} vs {want.blake3[:12]} in the "
                               "manifest)")


@dataclass(frozen=True)
class _Parts:
    """The typed parts of a manifest being parsed (see :meth:`Manifest.from_dict`)."""

    images: list[ImageEntry]
    rows: list[list[int]]
    sessions: list[str] | None
    shard: ShardInfo
    jsonl: ContentHash | None
    image_uuids: dict[str, str] | None
    media: dict[str, MediaSection] | None


def _image_entry(im: Mapping[str, Any]) -> ImageEntry:
    return ImageEntry(int(im["id"]), im.get("ref"), int(im["width"]), int(im["height"]),
                      int(im.get("bytes") or 0), str(im.get("blake3") or ""))


def _sessions(sessions: Any) -> list[str] | None:
    return None if sessions is None else [str(s) for s in sessions]


def _check_lines(fmt: str, parts: _Parts, source: str) -> None:
    """The manifest's parts describe one count of JSONL lines: a rows list cut short (or grown)
    while the ``jsonl`` block stayed intact is refused, not trusted."""
    if fmt == "multi_turn":
        if parts.sessions is None:
            return
        lines = sum(1 for i, s in enumerate(parts.sessions) if i == 0 or s != parts.sessions[i - 1])
    else:
        lines = len(parts.rows)
    start, stop = parts.shard.lines
    counts = {"rows": lines, "shard lines": stop - start}
    if parts.jsonl is not None:
        counts["jsonl lines"] = parts.jsonl.lines
    if len(set(counts.values())) > 1:
        said = ", ".join(f"{k} {v}" for k, v in counts.items())
        raise DatasetError(f"{source}: malformed manifest (its parts disagree on the line "
                           f"count: {said})")


def _shard(sh: Any, num_rows: int) -> ShardInfo:
    """The shard record (a file without one holds the whole dataset)."""
    if not sh:
        return ShardInfo(0, 1, (0, num_rows), num_rows)
    return ShardInfo(int(sh["index"]), int(sh["num_shards"]),
                     (int(sh["lines"][0]), int(sh["lines"][1])), int(sh["total_lines"]))


def _content_hash(js: Any) -> ContentHash | None:
    return None if js is None else ContentHash(int(js["bytes"]), int(js["lines"]),
                                               str(js["blake3"]))


def _uuids(uuids: Any) -> dict[str, str] | None:
    if uuids is not None and not isinstance(uuids, dict):
        raise TypeError("image_uuids is not an object")
    return uuids


def _media(media: Any, num_rows: int) -> dict[str, MediaSection] | None:
    if media is None:
        return None
    if not isinstance(media, dict):
        raise TypeError("media is not an object")
    sections = {str(m): MediaSection.from_dict(str(m), d) for m, d in media.items()}
    if any(len(section.rows) != num_rows for section in sections.values()):
        raise ValueError("media rows do not match the rows")
    return sections


def manifest_path(jsonl_path: Path) -> Path:
    """``data.jsonl`` -> ``data.jsonl.manifest.json``."""
    jsonl_path = Path(jsonl_path)
    return jsonl_path.with_name(jsonl_path.name + MANIFEST_SUFFIX)


def dump(manifest: Manifest) -> bytes:
    return orjson.dumps(manifest.to_dict(), option=orjson.OPT_INDENT_2 | orjson.OPT_APPEND_NEWLINE)


def read_manifest(jsonl_path: Path, verify: bool = True) -> Manifest | None:
    """The manifest of a dataset written by mmdatagen, or None when there is none.

    With ``verify`` (the default) the dataset file must match the manifest's recorded size and
    hash: a stale or foreign manifest is a :class:`DatasetError`, never silently trusted.
    """
    path = manifest_path(jsonl_path)
    if not path.is_file():
        return None
    try:
        data = orjson.loads(path.read_bytes())
    except (OSError, orjson.JSONDecodeError) as exc:
        raise DatasetError(f"cannot read manifest {path}: {exc}") from None
    version = data.get("manifest_version") if isinstance(data, dict) else None
    if version != MANIFEST_VERSION:
        raise DatasetError(f"{path} is not an mmdatagen manifest of version {MANIFEST_VERSION} "
                           f"(found {version!r}); regenerate the dataset")
    manifest = Manifest.from_dict(data, str(path))
    if verify and os.path.exists(jsonl_path):
        manifest.check_file(Path(jsonl_path), str(path))
    return manifest
