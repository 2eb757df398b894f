"""Materialise a plan into a dataset: images, texts, JSONL rows and the manifest.

One pipeline serves every workload kind. Each distinct image is rendered and encoded once
(file delivery) or on demand with a bounded cache (inline data URLs), in parallel threads
(PIL, zlib and numpy release the GIL); rows stream to a temporary file renamed at the end.
"""
from __future__ import annotations

import base64
import contextlib
import multiprocessing
import os
import sys
import time
import uuid
from collections import deque
from collections.abc import Iterator
from concurrent.futures import Executor, ProcessPoolExecutor, ThreadPoolExecutor
from dataclasses import dataclass, field
from functools import lru_cache
from pathlib import Path
from typing import Any

import blake3

from . import __version__
from .content.images import ImageFactory, ImageStyle
from .content.media import MediaItems, MediaTask, encode_item, inline_form, item_meta
from .content.text import TextEngine
from .errors import UserError
from .io.atomic import (
    atomic_group,
    check_path_text,
    check_target,
    output_lock,
    staged_dir,
)
from .io.manifest import (
    MANIFEST_SUFFIX,
    ContentHash,
    HashingWriter,
    ImageEntry,
    Manifest,
    ShardInfo,
    dump,
    manifest_path,
)
from .io.rows import dumps_line, session_object, turn_object
from .lifecycle import child_setup
from .plans.base import Plan, shard_range

DELIVERIES = ("path", "data-url", "url")
OUTPUT_FORMATS = ("single_turn", "multi_turn")
UUID_NAMESPACE = uuid.UUID("6f0c2f4e-3b1a-5d8e-9c7b-2a4d6e8f0a1c")


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
            raise UserError(f"unknown delivery {self.mode!r}; choose from {', '.join(DELIVERIES)}")
        if self.mode == "url" and not (self.base_url or "").startswith(("http://", "https://")):
            raise UserError("--delivery url needs --base-url starting with http:// or https://")


@dataclass(frozen=True)
class OutputSpec:
    """Where and how the dataset is written."""

    path: Path
    fmt: str = "single_turn"
    shard_index: int = 0
    num_shards: int = 1
    force: bool = False
    quiet: bool = False
    workers: int = 0
    output_length: int | None = None
    cache_mb: int = 96

    def validate(self) -> None:
        if self.fmt not in OUTPUT_FORMATS:
            raise UserError(f"unknown output format {self.fmt!r}; choose from {', '.join(OUTPUT_FORMATS)}")
        if self.output_length is not None and self.output_length <= 0:
            raise UserError("--output-length must be a positive integer")
        if self.workers < 0:
            raise UserError("--workers must be zero (all cores) or positive")

    @property
    def final_path(self) -> Path:
        """The file this shard writes (a shard suffix when the dataset is split)."""
        if self.num_shards == 1:
            return self.path
        stem, suffix = self.path.name, ""
        if stem.endswith(".jsonl"):
            stem, suffix = stem[:-6], ".jsonl"
        return self.path.with_name(f"{stem}.shard-{self.shard_index:05d}-of-{self.num_shards:05d}{suffix}")


@dataclass
class Result:
    """What a generation wrote."""

    path: Path
    manifest: Path
    rows: int
    images: int
    image_dir: Path | None
    seconds: float
    manifest_data: Manifest | None = field(repr=False, default=None)


def progress(total: int, desc: str, quiet: bool):
    """A tqdm bar on stderr; silent with --quiet or when stderr is not a terminal."""
    from tqdm import tqdm

    return tqdm(total=total, desc=desc, unit="img" if desc == "images" else "row",
                disable=quiet or not sys.stderr.isatty(), file=sys.stderr, leave=False)


def default_image_dir(output: Path) -> Path:
    """``data.jsonl`` -> ``data_images/`` beside it (shared by all shards of one dataset)."""
    name = output.name.removesuffix(".jsonl")
    return output.with_name(f"{name}_images")


def _lines(plan: Plan, fmt: str) -> list[list[int]]:
    """Row indices per output line: one row per line, or one session per line."""
    if fmt == "single_turn":
        return [[r] for r in range(plan.num_rows)]
    if plan.sessions is None:
        raise UserError("multi_turn output needs a workload with sessions")
    return [g.tolist() for g in plan.session_groups()]


@dataclass(frozen=True)
class _Task:
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


def _render(task: _Task) -> tuple[dict[str, Any], str | None]:
    """Render and encode one image; write it (file delivery) or return its data URL."""
    data = _factory(task.style, task.seed).encode(task.image_id, task.width, task.height)
    meta = {"id": task.image_id, "ref": None, "width": task.width, "height": task.height,
            "bytes": len(data), "blake3": blake3.blake3(data).hexdigest()}
    if task.file is not None:
        _write_file(task.file, data, task.run)
        return meta, None
    return meta, f"data:{task.style.mime};base64,{base64.b64encode(data).decode('ascii')}"


def _render_media(task: MediaTask) -> tuple[dict[str, Any], str | None]:
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


def _remove_temporaries(folder: Path | None, run: str) -> None:
    """Remove the image files this run's (killed) workers left half-written."""
    if folder is not None and folder.is_dir():
        for tmp in folder.glob(f".*.{run}.part"):
            with contextlib.suppress(OSError):
                tmp.unlink()


class _Workers(ProcessPoolExecutor):
    """A process pool whose ``with`` block, left by an exception (Ctrl-C, SIGTERM, a full
    disk), cancels the queued images and kills the workers instead of waiting for them."""

    def __exit__(self, exc_type, exc, tb):
        if exc_type is None:
            self.shutdown(wait=True)
        else:
            stop_workers(self)
        return False


class _Threads(ThreadPoolExecutor):
    def __exit__(self, exc_type, exc, tb):
        self.shutdown(wait=exc_type is None, cancel_futures=exc_type is not None)
        return False


def stop_workers(executor: Executor) -> None:
    """Stop now: cancel queued work and kill worker processes (they hold no state worth
    keeping; their half-written files are temporaries the caller removes)."""
    procs = list((getattr(executor, "_processes", None) or {}).values())
    executor.shutdown(wait=False, cancel_futures=True)
    for proc in procs:
        with contextlib.suppress(OSError, AttributeError, ValueError):
            proc.kill()
    for proc in procs:
        with contextlib.suppress(OSError, AttributeError, ValueError, AssertionError):
            proc.join(2)


def start_workers(workers: int = 0) -> Executor:
    """Worker processes for image work (forked: nothing to re-import), threads where fork is
    missing. Fork before starting threads of one's own (tokenizer loading does).

    Workers die with this process even when it is SIGKILLed (``lifecycle.die_with_parent``)
    and leave Ctrl-C and SIGTERM to it: it stops them (``stop_workers``) within a second.
    """
    if workers < 0:
        raise UserError("--workers must be zero (all cores) or positive")
    workers = workers or min(os.cpu_count() or 1, 8)
    if "fork" not in multiprocessing.get_all_start_methods():
        return _Threads(workers)
    pool = _Workers(workers, mp_context=multiprocessing.get_context("fork"),
                    initializer=child_setup, initargs=(os.getpid(),))
    pool.submit(int).result()  # launch the processes now
    return pool


class _Images:
    """Encoded images of one run: metadata for the manifest, a bounded cache for inline rows."""

    def __init__(self, plan: Plan, factory: ImageFactory, delivery: Delivery, out: OutputSpec,
                 write_dir: Path | None = None, run: str = ""):
        self.plan, self.factory, self.delivery = plan, factory, delivery
        self.write_dir = write_dir if write_dir is not None else delivery.image_dir
        self.run = run
        self.meta: dict[int, dict[str, Any]] = {}
        self.refs: dict[int, str] = {}
        self.cache_budget = out.cache_mb * 1024 * 1024
        self.cached_bytes = 0

    def name(self, image_id: int) -> str:
        return f"{image_id:06d}.{self.factory.style.extension}"

    def task(self, image_id: int) -> _Task:
        file = None
        if self.delivery.mode != "data-url":
            file = str(Path(self.write_dir) / self.name(image_id))
        return _Task(self.factory.style, self.factory.seed, image_id,
                     int(self.plan.widths[image_id]), int(self.plan.heights[image_id]), file,
                     self.run)

    def file_ref(self, image_id: int) -> str:
        return self.ref_for(self.name(image_id))

    def ref_for(self, name: str) -> str:
        """The reference rows carry for a file of the image folder (path or URL)."""
        d = self.delivery
        if d.mode == "url":
            return f"{str(d.base_url).rstrip('/')}/{name}"
        prefix = d.path_prefix if d.path_prefix is not None else str(Path(d.image_dir).resolve())
        return f"{prefix.rstrip('/')}/{name}" if prefix else name

    def add(self, meta: dict[str, Any], payload: str | None) -> None:
        """Record a rendered image: its manifest entry and the reference rows will carry."""
        image_id = meta["id"]
        if payload is None:
            meta["ref"] = self.file_ref(image_id)
            self.refs[image_id] = meta["ref"]
        else:
            self.refs[image_id] = payload
            self.cached_bytes += len(payload)
        self.meta.setdefault(image_id, meta)

    def uuid(self, image_id: int) -> str:
        return str(uuid.uuid5(UUID_NAMESPACE, self.meta[image_id]["blake3"]))


def _ensure_inline(images: _Images, pool: Executor, needed: list[int], bar) -> None:
    """Encode the data URLs ``needed`` next that are not cached."""
    missing = [i for i in dict.fromkeys(needed) if i not in images.refs]
    for meta, url in pool.map(_render, [images.task(i) for i in missing]):
        images.add(meta, url)
        bar.update(1)


def _evict(images: _Images, uses: dict[int, deque], position: int) -> None:
    """Drop data URLs never used again, then the furthest-next-use ones beyond the budget."""
    for image_id in [i for i, q in uses.items() if i in images.refs and (not q or q[0] < position)]:
        while uses[image_id] and uses[image_id][0] < position:
            uses[image_id].popleft()
        if not uses[image_id]:
            images.cached_bytes -= len(images.refs.pop(image_id))
    if images.cached_bytes > images.cache_budget:
        for image_id in sorted(images.refs, key=lambda i: uses[i][0] if uses[i] else -1, reverse=True):
            images.cached_bytes -= len(images.refs.pop(image_id))
            if images.cached_bytes <= images.cache_budget:
                break


@dataclass
class _Job:
    """One shard's slice of the plan and where it goes."""

    lines: list[list[int]]
    rows: list[int]
    span: range
    total_lines: int
    target: Path
    delivery: Delivery
    shared_images: bool  # the image folder is shared by every shard: files, not a swap

    @classmethod
    def of(cls, plan: Plan, delivery: Delivery, out: OutputSpec) -> _Job:
        lines = _lines(plan, out.fmt)
        span = shard_range(len(lines), out.shard_index, out.num_shards)
        mine = lines[span.start:span.stop]
        if delivery.mode != "data-url":
            image_dir = delivery.image_dir or default_image_dir(out.path)
            delivery = Delivery(delivery.mode, image_dir, delivery.path_prefix, delivery.base_url,
                                delivery.uuids)
        return cls(mine, [r for line in mine for r in line], span, len(lines), out.final_path,
                   delivery, out.num_shards > 1)


@contextlib.contextmanager
def _image_folder(job: _Job, out: OutputSpec) -> Iterator[Path | None]:
    """Where workers write image files: a staging folder swapped in whole at the end (one
    process writes the dataset), or the shared folder itself (shards write it together)."""
    image_dir = job.delivery.image_dir
    if job.delivery.mode == "data-url" or image_dir is None:
        yield None
        return
    if not job.shared_images:
        with output_lock(image_dir), staged_dir(image_dir, out.force) as stage:
            yield stage
        return
    check_path_text(image_dir)
    try:
        image_dir.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise UserError(f"cannot create image folder {image_dir}: {exc.strerror}") from None
    yield image_dir


def _uses(plan: Plan, rows: list[int], media: MediaItems | None) -> tuple[dict, dict]:
    """Positions (in row order) where each image, and each video/audio item, is used."""
    uses: dict[int, deque] = {}
    media_uses: dict[Any, deque] = {}
    for pos, r in enumerate(rows):
        for i in plan.image_ids[r]:
            uses.setdefault(int(i), deque()).append(pos)
        for key in media.keys(r) if media else ():
            media_uses.setdefault(key, deque()).append(pos)
    return uses, media_uses


def _submit(executor: Executor, fn, tasks: list, bar) -> list:
    """Queue file renders in the workers; each finished one ticks the bar."""
    pending = [executor.submit(fn, task) for task in tasks]
    for future in pending:
        future.add_done_callback(lambda _: bar.update(1))
    return pending


def _submit_files(executor: Executor, images: _Images, media: MediaItems | None,
                  needed: list[int], media_keys: list, uuids: bool, bar) -> tuple[list, list]:
    """File deliveries: workers write the files while this process writes rows (a file's
    reference is known before it exists, unless rows carry uuids, which hash the bytes)."""
    pending = []
    if images.delivery.mode != "data-url":
        pending = _submit(executor, _render, [images.task(i) for i in needed], bar)
        images.refs.update((i, images.file_ref(i)) for i in needed)
        if uuids:
            for future in pending:
                images.add(*future.result())
    media_pending = []
    if media:  # video/audio files render in the workers like images; inline ones per batch
        files = [k for k in media_keys if not media.inline(k[0])]
        media_pending = _submit(executor, _render_media, [media.task(k) for k in files], bar)
        media.refs.update((k, media.file_ref(k)) for k in files)
    return pending, media_pending


def _inline_batch(plan: Plan, images: _Images, media: MediaItems | None, executor: Executor,
                  batch_rows: list[int], inline: bool, inline_media: bool, bar) -> None:
    """Encode the data URLs a batch of rows needs and the cache does not hold."""
    if inline:
        _ensure_inline(images, executor, [int(i) for r in batch_rows for i in plan.image_ids[r]],
                       bar)
    if inline_media:
        missing = [k for k in media.needed(batch_rows) if media.inline(k[0]) and k not in media.refs]
        for meta, payload in executor.map(_render_media, [media.task(k) for k in missing]):
            media.add(meta, payload)
            bar.update(1)


def _write_rows(fh, plan: Plan, texts: TextEngine, images: _Images, job: _Job, out: OutputSpec,
                executor: Executor, media: MediaItems | None = None) -> None:
    """Render every line of the shard into ``fh``; image (and video/audio) work runs in
    ``executor``."""
    lines = job.lines
    inline = job.delivery.mode == "data-url"
    rows_of = _RowRenderer(plan, texts, images, job.rows, job.delivery.uuids, out, media)
    uses, media_uses = _uses(plan, job.rows, media)
    workers = out.workers or min(os.cpu_count() or 1, 8)
    with progress(len(uses) + len(media_uses), "images", out.quiet) as ibar, \
            progress(len(job.rows), "rows", out.quiet) as rbar:
        pending, media_pending = _submit_files(executor, images, media, list(uses),
                                               list(media_uses), job.delivery.uuids, ibar)
        inline_media = media is not None and any(media.inline(m) for m in plan.media)
        # Inline rows hold their images: small batches keep memory flat.
        chunk = max(1, workers) if inline or inline_media else len(lines) or 1
        pos = 0
        for start in range(0, len(lines), chunk):
            batch = lines[start:start + chunk]
            batch_rows = [r for line in batch for r in line]
            _inline_batch(plan, images, media, executor, batch_rows, inline, inline_media, ibar)
            for line in batch:
                fh.write(rows_of.line(line))
                rbar.update(len(line))
            pos += len(batch_rows)
            if inline:
                _evict(images, uses, pos)
            if inline_media:
                _evict(media, media_uses, pos)
        for future in pending:
            images.add(*future.result())
        for future in media_pending:
            media.add(*future.result())


class _RowRenderer:
    """JSONL bytes of one output line (a row, or a session of rows for multi_turn)."""

    def __init__(self, plan: Plan, texts: TextEngine, images: _Images, rows: list[int],
                 uuids: bool, out: OutputSpec, media: MediaItems | None = None) -> None:
        self.plan, self.texts, self.images, self.uuids, self.out = plan, texts, images, uuids, out
        self.media = media
        self.cache: dict[int, str] = {}
        self.shared_text = len(set(plan.text_keys[rows].tolist())) < len(rows)

    def text(self, r: int) -> str:
        key = int(self.plan.text_keys[r])
        if not self.shared_text:
            return self.texts.text(key)
        if key not in self.cache:
            self.cache[key] = self.texts.text(key)
        return self.cache[key]

    def turn(self, r: int) -> dict[str, Any]:
        ids = [int(i) for i in self.plan.image_ids[r]]
        images = self.images
        uuids = [images.uuid(i) for i in ids] if self.uuids else None
        sid = self.plan.session_id(r) if self.out.fmt == "single_turn" else None
        return turn_object(self.text(r), [images.refs[i] for i in ids], uuids, sid,
                           self.out.output_length, **(self.media.fields(r) if self.media else {}))

    def line(self, line: list[int]) -> bytes:
        if self.out.fmt == "single_turn":
            return dumps_line(self.turn(line[0]))
        return dumps_line(session_object(self.plan.session_id(line[0]),
                                         [self.turn(r) for r in line]))


def _manifest(plan: Plan, factory: ImageFactory, texts: TextEngine, images: _Images, job: _Job,
              out: OutputSpec, params: dict[str, Any], jsonl: ContentHash,
              media: MediaItems | None = None) -> Manifest:
    uuids = job.delivery.uuids
    return Manifest(
        mmdatagen_version=__version__, kind=plan.kind, format=out.fmt, params=params,
        seed=plan.params.get("seed"),
        shard=ShardInfo(out.shard_index, out.num_shards, (job.span.start, job.span.stop),
                        job.total_lines),
        delivery=job.delivery.mode, image_format=factory.style.fmt,
        image_content=factory.style.content, text_tokens=texts.tokens, tokenizer=texts.tok.name,
        jsonl=jsonl,
        images=[ImageEntry(**images.meta[i]) for i in sorted(images.meta)],
        rows=[[int(i) for i in plan.image_ids[r]] for r in job.rows],
        sessions=None if plan.sessions is None else [plan.session_id(r) for r in job.rows],
        image_uuids={str(i): images.uuid(i) for i in sorted(images.meta)} if uuids else None,
        media=media.manifest(job.rows, uuids) if media else None)


def generate(plan: Plan, factory: ImageFactory, texts: TextEngine, delivery: Delivery,
             out: OutputSpec, params: dict[str, Any], executor: Executor | None = None,
             media_styles: dict[str, Any] | None = None) -> Result:
    """Write the dataset shard described by ``out`` and its manifest; returns what was written.

    ``executor`` runs the image work (see :func:`start_workers`); one is made when not given.
    Everything is written aside (JSONL, manifest, a staging image folder) and put in place only
    when complete; an interrupt (Ctrl-C, SIGTERM) or a failure stops the workers at once and
    removes what this run wrote. One writer per output: a second one fails at once.
    ``media_styles`` maps "video"/"audio" to the styles of the plan's video and audio items.
    """
    started = time.perf_counter()
    delivery.validate()
    out.validate()
    job = _Job.of(plan, delivery, out)
    target = job.target
    run = f"{os.getpid()}-{uuid.uuid4().hex[:8]}"
    with contextlib.ExitStack() as stack:
        stack.enter_context(output_lock(target))
        check_target(target, out.force, longest_suffix=MANIFEST_SUFFIX)
        check_target(manifest_path(target), out.force)
        if executor is None:
            texts.tok.encode("")  # let a background tokenizer load finish before forking workers
            executor = stack.enter_context(start_workers(out.workers))
        open_ = stack.enter_context(atomic_group())  # JSONL + manifest renamed last, together
        write_dir = stack.enter_context(_image_folder(job, out))
        images = _Images(plan, factory, job.delivery, out, write_dir, run)
        media = (MediaItems(plan, dict(media_styles or {}), factory.seed, job.delivery,
                            images.ref_for, images.cache_budget, write_dir, run)
                 if plan.media else None)
        try:
            with open_(target) as raw:
                fh = HashingWriter(raw)
                _write_rows(fh, plan, texts, images, job, out, executor, media)
        except BaseException:
            stop_workers(executor)  # before the staging folder goes: nothing writes into it
            _remove_temporaries(write_dir, run)
            raise
        manifest = _manifest(plan, factory, texts, images, job, out, params, fh.result(), media)
        with open_(manifest_path(target)) as mfh:
            mfh.write(dump(manifest))
    return Result(path=target, manifest=manifest_path(target), rows=len(job.rows),
                  images=len(images.meta), image_dir=job.delivery.image_dir,
                  seconds=time.perf_counter() - started, manifest_data=manifest)
