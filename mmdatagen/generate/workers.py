"""What runs in the worker processes of a generation run: render, encode and write (or return
inline) one image, video or audio item. Tasks are small and cheap to pickle; a render is a pure
function of (style, seed, id, size), so where it runs never changes a byte. The pool itself is
``lifecycle.start_workers`` (re-exported here for the pipeline).
"""
from __future__ import annotations

import base64
import contextlib
import os
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path

import blake3

from ..content.images import ImageFactory, ImageStyle
from ..content.media import MediaTask, encode_item, inline_form
from ..content.video import VideoStyle
from ..io.manifest import AudioEntry, ImageEntry, MediaEntry, VideoEntry
from ..lifecycle import start_workers, stop_workers

__all__ = ["ImageTask", "item_meta", "remove_temporaries", "render_image", "render_media",
           "start_workers", "stop_workers"]


@dataclass(frozen=True)
class ImageTask:
    """One image to render in a worker: small and cheap to pickle."""

    style: ImageStyle
    seed: int
    image_id: int
    width: int
    height: int
    file: str | None  # write the image here; None: return it as a data URL
    run: str = ""     # this run's token in temporary names (so an interrupt can remove them)


@lru_cache(maxsize=4)
def _factory(style: ImageStyle, seed: int) -> ImageFactory:
    return ImageFactory(style, seed)


def render_image(task: ImageTask) -> tuple[ImageEntry, str | None]:
    """Render and encode one image; write it (file delivery) or return its data URL."""
    data = _factory(task.style, task.seed).encode(task.image_id, task.width, task.height)
    meta = ImageEntry(task.image_id, None, task.width, task.height, len(data),
                      blake3.blake3(data).hexdigest())
    if task.file is not None:
        _write_file(task.file, data, task.run)
        return meta, None
    return meta, f"data:{task.style.mime};base64,{base64.b64encode(data).decode('ascii')}"


def render_media(task: MediaTask) -> tuple[MediaEntry, str | None]:
    """Render and encode one video/audio item; write it (file delivery) or return its inline form."""
    data = encode_item(task)
    meta = item_meta(task, data)
    if task.file is not None:
        _write_file(task.file, data, task.run)
        return meta, None
    return meta, inline_form(task.modality, task.style, data)


def _write_file(file: str, data: bytes, run: str) -> None:
    """Write an image beside its final name, then rename (shards may share the folder)."""
    folder, name = os.path.split(file)
    tmp = os.path.join(folder, f".{name}.{run}.part")
    try:
        with open(tmp, "wb") as fh:
            fh.write(data)
        os.replace(tmp, file)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise


def remove_temporaries(folder: Path | None, run: str) -> None:
    """Remove the image files this run's (killed) workers left half-written."""
    if folder is not None and folder.is_dir():
        for tmp in folder.glob(f".*.{run}.part"):
            with contextlib.suppress(OSError):
                tmp.unlink()


def item_meta(task: MediaTask, data: bytes) -> MediaEntry:
    """The manifest entry of one item (``ref`` filled in by the run)."""
    style, digest = task.style, blake3.blake3(data).hexdigest()
    if isinstance(style, VideoStyle):
        frames = style.num_frames
        return VideoEntry(task.item_id, None, task.width, task.height, frames, style.fps,
                          frames / style.fps, style.codec_name, style.container, len(data),
                          digest)
    return AudioEntry(task.item_id, None, style.sample_rate, style.channels, style.num_samples,
                      style.num_samples / style.sample_rate, style.fmt, len(data), digest)
