"""The worker processes of a generation run and what runs in them: render, encode and write
(or return inline) one image, video or audio item. Tasks are small and cheap to pickle; a
render is a pure function of (style, seed, id, size), so where it runs never changes a byte.
"""
from __future__ import annotations

import base64
import contextlib
import multiprocessing
import os
from concurrent.futures import Executor, ProcessPoolExecutor, ThreadPoolExecutor
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path
from types import TracebackType
from typing import Literal

import blake3

from ..content.images import ImageFactory, ImageStyle
from ..content.media import MediaTask, encode_item, inline_form
from ..content.video import VideoStyle
from ..errors import SpecError
from ..io.manifest import AudioEntry, ImageEntry, MediaEntry, VideoEntry
from ..lifecycle import child_setup


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


class _Workers(ProcessPoolExecutor):
    """A process pool whose ``with`` block, left by an exception (Ctrl-C, SIGTERM, a full
    disk), cancels the queued images and kills the workers instead of waiting for them."""

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> Literal[False]:
        if exc_type is None:
            self.shutdown(wait=True)
        else:
            stop_workers(self)
        return False


class _Threads(ThreadPoolExecutor):
    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> Literal[False]:
        self.shutdown(wait=exc_type is None, cancel_futures=exc_type is not None)
        return False


def stop_workers(executor: Executor) -> None:
    """Stop now: cancel queued work and kill worker processes (they hold no state worth
    keeping; their half-written files are temporaries the caller removes)."""
    procs = list((getattr(executor, "_processes", None) or {}).values())
    manager = getattr(executor, "_executor_manager_thread", None)  # shutdown forgets it
    executor.shutdown(wait=False, cancel_futures=True)
    for proc in procs:
        with contextlib.suppress(OSError, AttributeError, ValueError):
            proc.kill()
    for proc in procs:
        with contextlib.suppress(OSError, AttributeError, ValueError, AssertionError):
            proc.join(2)
    # the pool's manager thread closes its wake-up pipe as it ends; an exit while it still
    # runs races Python's own exit hook writing to that pipe (3.11: "Exception ignored ...
    # Bad file descriptor" after the error line, 2 of 40 exits under load)
    if manager is not None:
        manager.join(2)


def start_workers(workers: int = 0) -> Executor:
    """Worker processes for image work (forked: nothing to re-import), threads where fork is
    missing. Fork before starting threads of one's own (tokenizer loading does).

    Workers die with this process even when it is SIGKILLed (``lifecycle.die_with_parent``)
    and leave Ctrl-C and SIGTERM to it: it stops them (``stop_workers``) within a second.
    """
    if workers < 0:
        raise SpecError("workers", "must be zero (all cores) or positive")
    workers = workers or min(os.cpu_count() or 1, 8)
    if "fork" not in multiprocessing.get_all_start_methods():
        return _Threads(workers)
    pool = _Workers(workers, mp_context=multiprocessing.get_context("fork"),
                    initializer=child_setup, initargs=(os.getpid(),))
    pool.submit(int).result()  # launch the processes now
    return pool


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
