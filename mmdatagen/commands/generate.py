"""``mmdatagen pool`` and ``mmdatagen sliding-window``: thin Click layers over plans + generate."""
from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import click

from ..errors import UserError
from ..presets import find_config, load_yaml

Decorator = Callable[[Callable], Callable]


def _load_config(ctx: click.Context, _param: click.Parameter, value: str | None) -> str | None:
    """Eager ``--config``: the YAML supplies defaults, so flags on the command line override it."""
    if not value:
        return value
    data = load_yaml(find_config(value))
    # A key is an option's parameter name or its long flag (``format`` for ``--format``/fmt).
    names = {}
    for p in ctx.command.params:
        if p.name and p.name != "config":
            for alias in [p.name, *(o[2:] for o in p.opts if o.startswith("--"))]:
                names[alias.replace("-", "_")] = p.name
    defaults = {}
    for key, val in data.items():
        name = names.get(str(key).replace("-", "_"))
        if name is None:
            raise UserError(f"unknown key {key!r} in config {value}")
        if isinstance(val, list) and name == "image_size":
            val = ",".join(str(v) for v in val)
        defaults[name] = val
    ctx.default_map = {**(ctx.default_map or {}), **defaults}
    return value


def _options(*decorators: Decorator) -> Decorator:
    def apply(fn: Callable) -> Callable:
        for dec in reversed(decorators):
            fn = dec(fn)
        return fn
    return apply


config_option = click.option(
    "--config", callback=_load_config, is_eager=True, expose_value=False,
    help="YAML preset (path or name of a shipped preset in configs/); flags override it.")

content_options = _options(
    click.option("--text-tokens", type=int, help="Text tokens per request (exact, re-tokenised)."),
    click.option("--tokenizer", help="words | qwen2.5 | qwen3-vl | qwen3.6 | a registry model | "
                 "a local tokenizer.json or folder."),
    click.option("--shared-prefix-tokens", type=int, default=0, show_default=True,
                 help="Start every text with the same N tokens (KV prefix-cache experiments)."),
    click.option("--output-length", type=int, help="Per-row output_length (max output tokens)."),
    click.option("--image-size", help="WxH (W wide, H tall) or weighted list 640x480:3,1024x768:1."),
    click.option("--image-content", type=click.Choice(["noise", "photo", "solid", "folder", "hf"]),
                 help="Pixels: uniform noise, photo-like scene, solid colour, a user folder, or a "
                 "local Hugging Face dataset."),
    click.option("--image-source-dir", type=click.Path(file_okay=False),
                 help="Folder of images for --image-content folder (resized; each slot distinct)."),
    click.option("--hf-dataset", type=click.Path(file_okay=False),
                 help="save_to_disk folder for --image-content hf (resized; each slot distinct)."),
    click.option("--hf-image-column", help="Image column of --hf-dataset (default: image)."),
    click.option("--image-format", type=click.Choice(["jpeg", "png"])),
    click.option("--jpeg-quality", type=int, default=85, show_default=True),
    click.option("--png-compress-level", type=int,
                 help="0-9; default 0 (stored, fast) for noise, 6 otherwise."),
    click.option("--target-bytes", type=int, help="Pad or re-encode each image to exactly N bytes."),
    click.option("--delivery", type=click.Choice(["path", "data-url", "url"]),
                 help="File paths, inline base64 data URLs, or http(s) URLs under --base-url."),
    click.option("--image-dir", type=click.Path(file_okay=False),
                 help="Folder for image files (default: <output>_images/ beside the output)."),
    click.option("--path-prefix", help="Folder written into rows instead of the image folder "
                 "(where the files will be mounted, e.g. /data/images)."),
    click.option("--base-url", help="Base URL for --delivery url."),
    click.option("--image-uuids/--no-image-uuids", default=False, show_default=True,
                 help="Add image_uuids (stable per image content)."),
)

media_options = _options(
    click.option("--video-size", help="Video WxH (even sides) or weighted list "
                 "640x360:3,1280x720:1 (default 640x360)."),
    click.option("--video-frames", type=int, help="Frames per video (default 16)."),
    click.option("--video-duration", type=float,
                 help="Seconds per video (frames = duration x fps; overrides --video-frames)."),
    click.option("--video-fps", type=float, help="Frames per second (default 2)."),
    click.option("--video-format", help="Container: mp4 (default) or webm."),
    click.option("--video-codec", help="h264 (mp4 default), vp9 (webm default), hevc or vp8."),
    click.option("--video-content", type=click.Choice(["shapes", "noise"]),
                 help="Moving shapes over a gradient (default) or per-frame noise (worst case)."),
    click.option("--audio-format", help="wav (16-bit PCM, default) or mp3."),
    click.option("--audio-sample-rate", type=int, help="Hz, 8000..192000 (default 16000)."),
    click.option("--audio-channels", type=int, help="1 or 2 (default 1)."),
    click.option("--audio-duration", type=float, help="Seconds per audio clip (default 5)."),
)

MEDIA_KEYS = ("video_size", "video_frames", "video_duration", "video_fps", "video_format",
              "video_codec", "video_content", "audio_format", "audio_sample_rate",
              "audio_channels", "audio_duration")


def media_styles(opts: dict[str, Any], plan) -> tuple[dict[str, Any], dict[str, Any]]:
    """Video/audio styles for the modalities the plan uses (pops every media option)."""
    from ..content.audio import AudioStyle
    from ..content.video import VideoStyle

    given = {k: opts.pop(k) for k in MEDIA_KEYS if k in opts}
    styles: dict[str, Any] = {}
    if "video" in plan.media:
        styles["video"] = VideoStyle(
            container=given.get("video_format") or "mp4", codec=given.get("video_codec"),
            fps=2.0 if given.get("video_fps") is None else given["video_fps"],
            frames=16 if given.get("video_frames") is None else given["video_frames"],
            duration=given.get("video_duration"), content=given.get("video_content") or "shapes")
    if "audio" in plan.media:
        styles["audio"] = AudioStyle(
            fmt=given.get("audio_format") or "wav",
            sample_rate=16000 if given.get("audio_sample_rate") is None else given["audio_sample_rate"],
            channels=1 if given.get("audio_channels") is None else given["audio_channels"],
            duration=5.0 if given.get("audio_duration") is None else given["audio_duration"])
    for style in styles.values():
        style.validate()
    # only the options of the modalities in use fix bytes: record those
    used = {k: v for k, v in given.items() if v is not None and k.split("_")[0] in styles}
    return styles, used


output_options = _options(
    click.option("--seed", type=int, default=0, show_default=True),
    click.option("-o", "--output", type=click.Path(dir_okay=False), help="Output JSONL path."),
    click.option("--shard-index", type=int, default=0, show_default=True),
    click.option("--num-shards", type=int, default=1, show_default=True,
                 help="Split rows into contiguous shards; shards concatenate to the full file."),
    click.option("--workers", type=int, default=0, help="Threads for image work (0: all cores)."),
    click.option("--output-format", type=click.Choice(["jsonl", "hf"]), default="jsonl",
                 show_default=True, help="hf: also a Hugging Face dataset <name>_hf/ (Image feature)."),
    click.option("--hf-parquet", is_flag=True, help="Also <name>.parquet (implies --output-format hf)."),
    click.option("--quiet", "-q", is_flag=True, help="No progress bar, no summary."),
    click.option("--force", "-f", is_flag=True, help="Overwrite existing outputs."),
)


def _with_defaults(opts: dict[str, Any], **defaults: Any) -> dict[str, Any]:
    """The workload's own defaults wherever neither the command line nor a config gave a value."""
    return {**opts, **{k: v for k, v in defaults.items() if opts.get(k) is None}}


def _run(plan_fn: Callable, plan_args: dict[str, Any], opts: dict[str, Any], fmt: str,
         default_name: str) -> None:
    """Validate everything, build the plan, materialise it, print where it went."""
    from ..content.images import ImageFactory, ImageStyle
    from ..content.text import TextEngine
    from ..content.tokenizers import get_tokenizer
    from ..generate import Delivery, OutputSpec, generate, start_workers

    media_args = {k: plan_args.pop(k) for k in ("videos_per_request", "audios_per_request",
                                                "video_pool_size", "audio_pool_size")
                  if k in plan_args}
    plan = plan_fn(**plan_args, **media_args, image_size=opts["image_size"], seed=opts["seed"],
                   video_size=opts.get("video_size") or "640x360")
    styles, media_used = media_styles(opts, plan)
    plan_args.update({k: v for k, v in media_args.items() if v})
    style = ImageStyle(content=opts["image_content"], fmt=opts["image_format"],
                       quality=opts["jpeg_quality"], png_compress_level=opts["png_compress_level"],
                       target_bytes=opts["target_bytes"], folder=opts["image_source_dir"],
                       hf_dataset=opts["hf_dataset"], hf_image_column=opts["hf_image_column"] or "image")
    factory = ImageFactory(style, opts["seed"])
    delivery = Delivery(mode=opts["delivery"],
                        image_dir=Path(opts["image_dir"]) if opts["image_dir"] else None,
                        path_prefix=opts["path_prefix"], base_url=opts["base_url"],
                        uuids=opts["image_uuids"])
    out = OutputSpec(path=Path(opts["output"] or default_name), fmt=fmt,
                     shard_index=opts["shard_index"], num_shards=opts["num_shards"],
                     force=opts["force"], quiet=opts["quiet"], workers=opts["workers"],
                     output_length=opts["output_length"])
    # Everything that fixes the bytes, nothing about where this copy lives or how it was run.
    skip = ("quiet", "force", "workers", "output", "shard_index", "num_shards", "output_format",
            "hf_parquet")
    params = {**plan_args, **{k: v for k, v in opts.items() if k not in skip}, **media_used,
              "format": fmt}
    hf = opts["output_format"] == "hf" or opts["hf_parquet"]
    if hf:
        from ..io.hf import check_targets, write_hf

        check_targets(out.final_path, opts["hf_parquet"], opts["force"])
    with start_workers(opts["workers"]) as executor:  # fork before a tokenizer starts a thread
        texts = TextEngine(get_tokenizer(opts["tokenizer"]), opts["text_tokens"], opts["seed"],
                           opts["shared_prefix_tokens"])
        result = generate(plan, factory, texts, delivery, out, params, executor,
                          media_styles=styles)
    if hf:
        write_hf(result.path, result.image_dir, opts["hf_parquet"], opts["force"])
    if not opts["quiet"]:
        where = f", images in {result.image_dir}" if result.image_dir else ""
        section = result.manifest_data.media or {}
        items = f"{result.images} images" + "".join(
            f", {len(section[m]['items'])} {m}s" for m in section)
        click.echo(f"wrote {result.rows} rows, {items}{where} in {result.seconds:.2f} s", err=True)
    click.echo(str(result.path))


@click.command()
@config_option
@click.option("-n", "--num-requests", type=int, default=1000, show_default=True)
@click.option("--pool-size", type=int, default=200, show_default=True)
@click.option("--images-per-request", type=int, default=1, show_default=True)
@click.option("--videos-per-request", type=int, default=0, show_default=True,
              help="Video items per request (their own pool, same reuse rule).")
@click.option("--audios-per-request", type=int, default=0, show_default=True,
              help="Audio items per request (their own pool, same reuse rule).")
@click.option("--video-pool-size", type=int, help="Distinct videos (default: --pool-size).")
@click.option("--audio-pool-size", type=int, help="Distinct audios (default: --pool-size).")
@click.option("--reuse", type=click.Choice(["first-pass-unique", "uniform", "zipf", "cyclic"]),
              default="first-pass-unique", show_default=True,
              help="How slots draw from the pool (first-pass-unique: the seeds' rule).")
@click.option("--zipf-exponent", type=float, default=1.0, show_default=True)
@click.option("--target-reuse", type=float,
              help="Best-possible hit rate to reach; derives the pool size (first-pass-unique).")
@content_options
@media_options
@output_options
def pool(**opts: Any) -> None:
    """Single-turn requests drawing images from a pool with controlled reuse.

    With no options: the reference dataset (1,000 requests, 1 image each, pool of 200,
    400 text tokens, seed 0), photo-like 640x480 JPEG files.
    """
    from ..plans import pool_plan
    from ..plans.pool import pool_size_for_reuse

    opts = _with_defaults(opts, text_tokens=400, tokenizer="qwen3-vl", image_size="640x480",
                          image_content="photo", image_format="jpeg", delivery="path")
    plan_args = {k: opts.pop(k) for k in ("num_requests", "pool_size", "images_per_request",
                                          "reuse", "zipf_exponent", "target_reuse",
                                          "videos_per_request", "audios_per_request",
                                          "video_pool_size", "audio_pool_size")}
    if plan_args["target_reuse"] is not None:
        plan_args["pool_size"] = pool_size_for_reuse(plan_args["num_requests"],
                                                     max(1, plan_args["images_per_request"]),
                                                     plan_args["target_reuse"])
    name = (f"pool_{plan_args['num_requests']}req_{plan_args['images_per_request']}img_"
            f"pool{plan_args['pool_size']}.jsonl")
    _run(pool_plan, plan_args, opts, "single_turn", name)


@click.command("sliding-window")
@config_option
@click.option("--users", type=int, default=30, show_default=True)
@click.option("--turns", type=int, default=8, show_default=True)
@click.option("--window", type=int, default=5, show_default=True, help="Images per request.")
@click.option("--videos-per-request", type=int, default=0, show_default=True,
              help="Video window per request (each user's own videos slide by --stride).")
@click.option("--audios-per-request", type=int, default=0, show_default=True,
              help="Audio window per request (each user's own audios slide by --stride).")
@click.option("--stride", type=int, default=1, show_default=True, help="New images per turn.")
@click.option("--order", type=click.Choice(["turn-major", "user-major", "random"]),
              default="turn-major", show_default=True, help="Row order (random: seeded interleave).")
@click.option("--shared-fraction", type=float, default=0.0, show_default=True,
              help="Share of each window drawn from one sequence common to all users.")
@click.option("--text-sharing", type=click.Choice(["row", "user", "all"]), default="row",
              show_default=True, help="Fresh text per row, one per user, or one for all rows.")
@click.option("--format", "fmt", type=click.Choice(["single_turn", "multi_turn"]),
              default="single_turn", show_default=True,
              help="single_turn with session_id (causal replay) or multi_turn sessions.")
@content_options
@media_options
@output_options
def sliding_window(**opts: Any) -> None:
    """Per-user sessions whose consecutive turns share images (a sliding window).

    With no options: the reference dataset (30 users x 8 turns, window 5, 2400x1080 images
    as inline base64 data URLs, 8,000 text tokens, turn-major), photo-like JPEG content.
    """
    from ..plans import sliding_window_plan

    opts = _with_defaults(opts, text_tokens=8000, tokenizer="qwen3.6", image_size="2400x1080",
                          image_content="photo", image_format="jpeg", delivery="data-url")
    fmt = opts.pop("fmt")
    plan_args = {k: opts.pop(k) for k in ("users", "turns", "window", "stride", "order",
                                          "shared_fraction", "text_sharing",
                                          "videos_per_request", "audios_per_request")}
    name = (f"sw_{plan_args['users']}u_{plan_args['turns']}t_{plan_args['window']}w_"
            f"{opts['text_tokens']}tok.jsonl")
    _run(sliding_window_plan, plan_args, opts, fmt, name)
