"""Streaming readers for AIPerf custom-dataset JSONL (``single_turn``, ``multi_turn``, ``random_pool``).

Rows are parsed one line at a time (lines may hold tens of MB of base64), so memory stays flat.
"""
from __future__ import annotations

import gzip
import math
import zlib
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, Any

import orjson

from ..errors import DatasetError

FORMATS = ("single_turn", "multi_turn", "random_pool")


@dataclass
class Turn:
    """One request's worth of a dataset row, normalised from AIPerf's singular/plural fields."""

    texts: list[str] = field(default_factory=list)
    images: list[str] = field(default_factory=list)
    image_uuids: list[str] | None = None
    session_id: str | None = None
    turn_index: int = 0
    line_no: int = 0
    output_length: int | None = None
    delay_ms: float | None = None
    timestamp_ms: float | None = None
    role: str | None = None
    extra: dict[str, Any] | None = None
    audios: list[str] = field(default_factory=list)
    videos: list[str] = field(default_factory=list)


def open_text(path: Path) -> IO[bytes]:
    """Open a dataset for binary line reading, transparently un-gzipping ``.gz``."""
    path = Path(path)
    try:
        if path.suffix == ".gz":
            return gzip.open(path, "rb")  # type: ignore[return-value]  # a binary file object
        return open(path, "rb", buffering=1 << 20)
    except OSError as exc:
        raise DatasetError(f"cannot read {path}: {exc.strerror}") from None


def _lines(fh: IO[bytes], path: Path) -> Iterator[tuple[int, bytes]]:
    """Numbered lines; a truncated or corrupt ``.gz`` (or a failing disk) is a one-line error
    naming the file and line, never a silent early end."""
    line_no = 0
    it = iter(fh)
    while True:
        try:
            line = next(it)
        except StopIteration:
            return
        except (EOFError, zlib.error, gzip.BadGzipFile) as exc:
            raise DatasetError(f"{path}:{line_no + 1}: truncated or corrupt compressed data "
                               f"({exc})") from None
        except OSError as exc:
            raise DatasetError(f"{path}:{line_no + 1}: cannot read ({exc.strerror or exc})") \
                from None
        line_no += 1
        yield line_no, line


def iter_objects(path: Path) -> Iterator[tuple[int, dict]]:
    """Yield ``(line_no, object)`` for every non-empty line; a bad line is a one-line error."""
    with open_text(path) as fh:
        for line_no, line in _lines(fh, Path(path)):
            if line.isspace():  # stops at the first non-space byte; strip() would copy the line
                continue
            try:
                obj = orjson.loads(line)
            except orjson.JSONDecodeError as exc:
                raise DatasetError(f"{path}:{line_no}: not valid JSON ({exc.msg})") from None
            if not isinstance(obj, dict):
                raise DatasetError(f"{path}:{line_no}: each line must be a JSON object")
            yield line_no, obj


def detect_format(path: Path) -> str:
    """``multi_turn`` when the first object has ``turns``, else ``single_turn``."""
    for _, obj in iter_objects(path):
        return "multi_turn" if "turns" in obj else "single_turn"
    raise DatasetError(f"{path}: no rows")


def _plural(obj: dict, one: str, many: str, where: str) -> list:
    if one in obj and many in obj:
        raise DatasetError(f"{where}: '{one}' and '{many}' are mutually exclusive")
    if one in obj:
        value = obj[one]
        return [] if value is None else [value]
    value = obj.get(many) or []
    if not isinstance(value, list):
        raise DatasetError(f"{where}: '{many}' must be a list")
    return value


def parse_turn(obj: dict, where: str) -> Turn:
    """Normalise one single_turn object (or one entry of ``turns``)."""
    texts = _plural(obj, "text", "texts", where)
    images = _plural(obj, "image", "images", where)
    uuids = _image_uuids(obj, images, where)
    audios = _plural(obj, "audio", "audios", where)
    videos = _plural(obj, "video", "videos", where)
    if not (texts or images or uuids or audios or videos):
        raise DatasetError(f"{where}: a row needs at least one of text, image, audio or video")
    _check_items(texts, images, audios, videos, where)
    _check_scalars(obj, where)
    out_len, extra = obj.get("output_length"), obj.get("extra")
    sid = obj.get("session_id")
    return Turn(texts=texts, images=images, image_uuids=uuids,
                session_id=None if sid is None else str(sid), output_length=out_len,
                delay_ms=obj.get("delay"), timestamp_ms=obj.get("timestamp"),
                role=obj.get("role"), extra=extra, audios=audios, videos=videos)


def _check_items(texts: list, images: list, audios: list, videos: list, where: str) -> None:
    for item in texts + images:
        if not isinstance(item, str):
            raise DatasetError(f"{where}: texts and images must be strings")
    for name, items in (("audios", audios), ("videos", videos)):
        if not all(item is None or isinstance(item, str) for item in items):  # null: skipped
            raise DatasetError(f"{where}: {name} must be strings (a path, URL or inline data)")


def _check_scalars(obj: dict, where: str) -> None:
    """The row's numbers and objects, typed before anything uses them."""
    out_len = obj.get("output_length")
    if out_len is not None and (not isinstance(out_len, int) or isinstance(out_len, bool)
                                or out_len <= 0):
        raise DatasetError(f"{where}: 'output_length' must be a positive integer")
    extra = obj.get("extra")
    if extra is not None and not isinstance(extra, dict):
        raise DatasetError(f"{where}: 'extra' must be an object")
    for key in ("delay", "timestamp"):
        value = obj.get(key)
        if value is not None and not _milliseconds(value):
            raise DatasetError(f"{where}: '{key}' must be a finite number of milliseconds >= 0")
    if obj.get("role") is not None and not isinstance(obj["role"], str):
        raise DatasetError(f"{where}: 'role' must be a string")


def _milliseconds(value: object) -> bool:
    return (isinstance(value, (int, float)) and not isinstance(value, bool)
            and math.isfinite(value) and value >= 0)


def _image_uuids(obj: dict, images: list, where: str) -> list | None:
    uuids = obj.get("image_uuids")
    if uuids is not None and not isinstance(uuids, list):
        raise DatasetError(f"{where}: 'image_uuids' must be a list")
    if uuids is not None and images and len(uuids) != len(images):
        raise DatasetError(f"{where}: 'image_uuids' has {len(uuids)} entries for {len(images)} images")
    return uuids


def iter_turns(path: Path, fmt: str = "auto") -> Iterator[Turn]:
    """Every request-turn of a dataset in file order.

    ``multi_turn`` sessions are flattened (turn_index counts within the session);
    single_turn rows keep their ``session_id`` (None for a one-request session).
    """
    path = Path(path)
    if fmt == "auto":
        fmt = detect_format(path)
    if fmt not in FORMATS:
        raise DatasetError(f"unknown dataset format {fmt!r}; expected one of {', '.join(FORMATS)}")
    for line_no, obj in iter_objects(path):
        where = f"{path}:{line_no}"
        if fmt == "multi_turn":
            turns = obj.get("turns")
            if not isinstance(turns, list) or not turns:
                raise DatasetError(f"{where}: multi_turn rows need a non-empty 'turns' list")
            sid = obj.get("session_id")
            sid = f"session_{line_no}" if sid is None else str(sid)
            for i, raw in enumerate(turns):
                if not isinstance(raw, dict):
                    raise DatasetError(f"{where}: each turn must be an object")
                turn = parse_turn(raw, f"{where} turn {i}")
                turn.session_id, turn.turn_index, turn.line_no = sid, i, line_no
                yield turn
        else:
            turn = parse_turn(obj, where)
            turn.line_no = line_no
            yield turn
