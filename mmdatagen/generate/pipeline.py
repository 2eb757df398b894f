"""The generation pipeline: a plan's shard -> JSONL rows, item files and the manifest.

Each distinct item is rendered and encoded once (file delivery: queued at once in the workers,
written while rows are) or on demand into a bounded cache (inline delivery: batch by batch);
rows stream to a temporary file renamed, with the manifest, only when everything is complete.
"""
from __future__ import annotations

import contextlib
import os
import time
import uuid
from collections.abc import Callable, Iterator, Mapping
from concurrent.futures import Executor, Future
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, TypeVar

from .. import __version__
from ..console import Bar, progress_bar
from ..content.audio import AudioStyle
from ..content.images import ImageFactory
from ..content.inline import use_positions
from ..content.text import TextEngine
from ..content.video import VideoStyle
from ..errors import SpecError, UserError
from ..io.atomic import (
    atomic_group,
    check_path_text,
    check_target,
    output_lock,
    staged_dir,
)
from ..io.manifest import (
    MANIFEST_SUFFIX,
    ContentHash,
    HashingWriter,
    ImageEntry,
    Manifest,
    MediaEntry,
    ShardInfo,
    dump,
    manifest_path,
)
from ..io.rows import dumps_line, session_object, turn_object
from ..plans.base import Plan, shard_range
from .items import Delivery, ImageItems, MediaItems
from .workers import remove_temporaries, render_image, render_media, start_workers, stop_workers

_T = TypeVar("_T")

OUTPUT_FORMATS = ("single_turn", "multi_turn")


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
            raise SpecError("format", f"must be one of {', '.join(OUTPUT_FORMATS)}, got {self.fmt!r}")
        if self.output_length is not None and self.output_length <= 0:
            raise SpecError("output_length", "must be a positive integer")
        if self.workers < 0:
            raise SpecError("workers", "must be zero (all cores) or positive")

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


def progress(total: int, desc: str, quiet: bool) -> contextlib.AbstractContextManager[Bar]:
    """The images' or rows' bar on stderr (``console.progress_bar``)."""
    bar: contextlib.AbstractContextManager[Bar] = progress_bar(
        total, quiet, desc=desc, unit="img" if desc == "images" else "row")
    return bar


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
            delivery = replace(delivery, image_dir=delivery.image_dir or default_image_dir(out.path))
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


Rendered = TypeVar("Rendered", ImageEntry, MediaEntry)


class _Renders:
    """The image and video/audio work of one shard, in the workers: files are all queued at
    once (written while rows are), inline items rendered batch by batch into bounded caches."""

    def __init__(self, plan: Plan, rows: list[int], images: ImageItems, media: MediaItems | None,
                 executor: Executor) -> None:
        self.plan, self.images, self.media, self.executor = plan, images, media, executor
        self.image_uses = use_positions([int(i) for i in plan.image_ids[r]] for r in rows)
        self.media_uses = use_positions(media.keys(r) for r in rows) if media else {}
        self.inline_media = media is not None and media.any_inline
        self.pending: list[Future[tuple[ImageEntry, str | None]]] = []
        self.media_pending: list[Future[tuple[MediaEntry, str | None]]] = []

    @property
    def total(self) -> int:
        return len(self.image_uses) + len(self.media_uses)

    @property
    def any_inline(self) -> bool:
        return self.images.inline or self.inline_media

    def start_files(self, uuids: bool, bar: Bar) -> None:
        """Queue every file render (a file's reference is known before it exists, unless rows
        carry uuids, which hash the bytes: then wait for the images)."""
        images, media = self.images, self.media
        if not images.inline:
            ids = list(self.image_uses)
            self.pending = _submit(self.executor, render_image, [images.task(i) for i in ids], bar)
            images.expect_files(ids)
            if uuids:
                for future in self.pending:
                    images.add(*future.result())
        if media is not None:
            files = [k for k in self.media_uses if not media.inline(k[0])]
            self.media_pending = _submit(self.executor, render_media,
                                         [media.task(k) for k in files], bar)
            media.expect_files(files)

    def render_inline(self, rows: list[int], bar: Bar) -> None:
        """Encode the inline items ``rows`` need that the caches do not hold."""
        images, media = self.images, self.media
        if images.inline:
            needed = dict.fromkeys(int(i) for r in rows for i in self.plan.image_ids[r])
            missing = [i for i in needed if i not in images.cache]
            for meta, url in self.executor.map(render_image, [images.task(i) for i in missing]):
                images.add(meta, url)
                bar.update(1)
        if media is not None and self.inline_media:
            tasks = [media.task(k) for k in media.missing_inline(rows)]
            for item, payload in self.executor.map(render_media, tasks):
                media.add(item, payload)
                bar.update(1)

    def evict(self, position: int) -> None:
        """Drop the inline items rows before ``position`` were the last to use (and more,
        furthest next use first, while over the budget)."""
        if self.images.inline:
            self.images.cache.evict(self.image_uses, position)
        if self.media is not None and self.inline_media:
            self.media.cache.evict(self.media_uses, position)

    def finish(self) -> None:
        """Wait for the file renders and record them."""
        for future in self.pending:
            self.images.add(*future.result())
        if self.media is not None:
            for mfuture in self.media_pending:
                self.media.add(*mfuture.result())


def _submit(executor: Executor, fn: Callable[[_T], tuple[Rendered, str | None]], tasks: list[_T],
            bar: Bar) -> list[Future[tuple[Rendered, str | None]]]:
    """Queue file renders in the workers; each finished one ticks the bar."""
    pending = [executor.submit(fn, task) for task in tasks]
    for future in pending:
        future.add_done_callback(lambda _: bar.update(1))
    return pending


def _batches(lines: list[list[int]], size: int) -> Iterator[list[list[int]]]:
    for start in range(0, len(lines), size):
        yield lines[start:start + size]


def _write_rows(fh: HashingWriter, plan: Plan, texts: TextEngine, images: ImageItems, job: _Job,
                out: OutputSpec, executor: Executor, media: MediaItems | None = None) -> None:
    """Render every line of the shard into ``fh``; image (and video/audio) work runs in
    ``executor``."""
    rows_of = _RowRenderer(plan, texts, images, job.rows, job.delivery.uuids, out, media)
    renders = _Renders(plan, job.rows, images, media, executor)
    workers = out.workers or min(os.cpu_count() or 1, 8)
    # Inline rows hold their images: small batches keep memory flat.
    size = max(1, workers) if renders.any_inline else len(job.lines) or 1
    with progress(renders.total, "images", out.quiet) as ibar, \
            progress(len(job.rows), "rows", out.quiet) as rbar:
        renders.start_files(job.delivery.uuids, ibar)
        position = 0
        for batch in _batches(job.lines, size):
            batch_rows = [r for line in batch for r in line]
            renders.render_inline(batch_rows, ibar)
            for line in batch:
                fh.write(rows_of.line(line))
                rbar.update(len(line))
            position += len(batch_rows)
            renders.evict(position)
        renders.finish()


class _RowRenderer:
    """JSONL bytes of one output line (a row, or a session of rows for multi_turn)."""

    def __init__(self, plan: Plan, texts: TextEngine, images: ImageItems, rows: list[int],
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
        return turn_object(self.text(r), [images.ref(i) for i in ids], uuids, sid,
                           self.out.output_length, **(self.media.fields(r) if self.media else {}))

    def line(self, line: list[int]) -> bytes:
        if self.out.fmt == "single_turn":
            return dumps_line(self.turn(line[0]))
        sid = self.plan.session_id(line[0])
        if sid is None:
            raise ValueError("multi_turn lines need a plan with sessions")
        return dumps_line(session_object(sid, [self.turn(r) for r in line]))


def _session_ids(plan: Plan, rows: list[int]) -> list[str] | None:
    if plan.sessions is None:
        return None
    return [plan.session_format.format(int(plan.sessions[r])) for r in rows]


def _manifest(plan: Plan, factory: ImageFactory, texts: TextEngine, images: ImageItems, job: _Job,
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
        images=[images.meta[i] for i in sorted(images.meta)],
        rows=[[int(i) for i in plan.image_ids[r]] for r in job.rows],
        sessions=_session_ids(plan, job.rows),
        image_uuids={str(i): images.uuid(i) for i in sorted(images.meta)} if uuids else None,
        media=media.manifest(job.rows, uuids) if media else None)


def generate(plan: Plan, factory: ImageFactory, texts: TextEngine, delivery: Delivery,
             out: OutputSpec, params: dict[str, Any], executor: Executor | None = None,
             media_styles: Mapping[str, VideoStyle | AudioStyle] | None = None) -> Result:
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
        budget = out.cache_mb * 1024 * 1024
        images = ImageItems(plan, factory, job.delivery, budget, write_dir, run)
        media = (MediaItems(plan, media_styles or {}, factory.seed, job.delivery, budget,
                            write_dir, run) if plan.media else None)
        try:
            with open_(target) as raw:
                fh = HashingWriter(raw)
                _write_rows(fh, plan, texts, images, job, out, executor, media)
        except BaseException:
            stop_workers(executor)  # before the staging folder goes: nothing writes into it
            remove_temporaries(write_dir, run)
            raise
        manifest = _manifest(plan, factory, texts, images, job, out, params, fh.result(), media)
        with open_(manifest_path(target)) as mfh:
            mfh.write(dump(manifest))
    return Result(path=target, manifest=manifest_path(target), rows=len(job.rows),
                  images=len(images.meta), image_dir=job.delivery.image_dir,
                  seconds=time.perf_counter() - started, manifest_data=manifest)
