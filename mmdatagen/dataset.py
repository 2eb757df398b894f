"""Specs -> plan -> materialised dataset: the library call behind ``pool`` and ``sliding-window``."""
from __future__ import annotations

import contextlib
import shutil
from dataclasses import asdict
from pathlib import Path
from typing import TYPE_CHECKING, Any

from .settings.content import Content, Media, Output
from .settings.workload import PoolWorkload, SlidingWindowWorkload

if TYPE_CHECKING:  # imported where used: the CLI starts without numpy, PIL or PyAV
    from .generate import Result
    from .plans.base import Plan

Workload = PoolWorkload | SlidingWindowWorkload


def default_name(workload: Workload, content: Content) -> str:
    """The output file name when ``-o`` gives none (or gives a folder)."""
    if isinstance(workload, PoolWorkload):
        return (f"pool_{workload.num_requests}req_{workload.images_per_request}img_"
                f"pool{workload.resolved_pool_size()}.jsonl")
    return (f"sw_{workload.users}u_{workload.turns}t_{workload.window}w_"
            f"{content.text_tokens}tok.jsonl")


def manifest_params(workload: Workload, content: Content, output: Output,
                    media_used: dict[str, Any]) -> dict[str, Any]:
    """Everything that fixes the bytes, nothing about where this copy lives or how it was run."""
    fmt = "single_turn" if isinstance(workload, PoolWorkload) else workload.dataset_type
    return {**workload.plan_args(), **asdict(content), "seed": output.seed, **media_used,
            "format": fmt}


def make_plan(workload: Workload, content: Content, media: Media, seed: int) -> Plan:
    from .plans import pool_plan, sliding_window_plan
    from .plans.media import DEFAULT_VIDEO_SIZE

    fn = pool_plan if isinstance(workload, PoolWorkload) else sliding_window_plan
    return fn(**workload.plan_args(), image_size=content.image_size, seed=seed,
              video_size=media.video_size or DEFAULT_VIDEO_SIZE)


def make_dataset(workload: Workload, content: Content, output: Output,
                 media: Media | None = None) -> Result:
    """Build the plan, render and write it (and the Hugging Face copy when asked)."""
    from .content.images import ImageFactory, ImageStyle
    from .content.text import TextEngine
    from .content.tokenizers import get_tokenizer
    from .generate import Delivery, OutputSpec, generate, start_workers

    media = media or Media()
    plan = make_plan(workload, content, media, output.seed)
    styles, media_used = media.styles(plan.media)
    fmt = "single_turn" if isinstance(workload, PoolWorkload) else workload.dataset_type
    c = content
    style = ImageStyle(content=c.image_content, fmt=c.image_format, quality=c.jpeg_quality,
                       png_compress_level=c.png_compress_level, target_bytes=c.target_bytes,
                       folder=c.image_source_dir, hf_dataset=c.hf_dataset,
                       hf_image_column=c.hf_image_column or "image")
    delivery = Delivery(mode=c.delivery, image_dir=Path(c.image_dir) if c.image_dir else None,
                        path_prefix=c.path_prefix, base_url=c.base_url, uuids=c.image_uuids)
    out = OutputSpec(path=Path(output.path(default_name(workload, content))), fmt=fmt,
                     shard_index=output.shard_index, num_shards=output.num_shards,
                     force=output.force, quiet=output.quiet, workers=output.workers,
                     output_length=c.output_length)
    params = manifest_params(workload, content, output, media_used)
    with contextlib.ExitStack() as locks:
        from .io.atomic import reading

        locks.enter_context(reading([c.image_source_dir, c.hf_dataset]))  # never written over
        if output.hf:  # the JSONL and its HF copy are one output: whole or absent
            from .io.atomic import output_lock
            from .io.hf import check_targets

            for path in (out.final_path, *check_targets(out.final_path, output.hf_parquet,
                                                        output.force)):
                locks.enter_context(output_lock(path))
        done: list[Result] = []
        try:
            with start_workers(output.workers) as executor:  # fork before a tokenizer's thread
                texts = TextEngine(get_tokenizer(c.tokenizer), c.text_tokens, output.seed,
                                   c.shared_prefix_tokens)
                done.append(generate(plan, ImageFactory(style, output.seed), texts, delivery,
                                     out, params, executor, media_styles=styles))
            if output.hf:
                from .io.hf import write_hf

                write_hf(done[0].path, done[0].image_dir, output.hf_parquet, output.force)
        except BaseException:
            if output.hf and done:  # stopped after the JSONL was in place (the workers'
                _remove_written(done[0], output)  # exit included): none of the output stays
            raise
    return done[0]


def _remove_written(result: Result, output: Output) -> None:
    """The dataset just written, when its Hugging Face copy failed (disk full, SIGTERM): no half
    of the output is left."""
    for path in (result.path, result.manifest):
        with contextlib.suppress(OSError):
            path.unlink()
    if result.image_dir is not None and output.num_shards == 1:  # shards share the folder
        shutil.rmtree(result.image_dir, ignore_errors=True)


def summary(result: Result) -> str:
    """``wrote N rows, M images[, K videos...][, images in DIR] in T s``."""
    media = result.manifest_data.media if result.manifest_data is not None else None
    items = f"{result.images} images" + "".join(
        f", {len(section.items)} {m}s" for m, section in (media or {}).items())
    where = f", images in {result.image_dir}" if result.image_dir else ""
    return f"wrote {result.rows} rows, {items}{where} in {result.seconds:.2f} s"
