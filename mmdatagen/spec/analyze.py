"""``analyze``'s options: what to analyse (a dataset or workload plans, possibly a sweep), the
cache and its semantics, the outputs. ``AnalyzeRequest`` is the whole request the library runs
(``analysis.run``); lists and ranges (``1,4,10``, ``0:20:2``) are expanded by :func:`numbers`.
"""
from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

from ..errors import SpecError
from .base import build, option, spec
from .cache import KEY_MODES, AnalyzeModel, Geometry
from .common import quiet
from .content import Media
from .workload import REUSE_MODES, ROW_ORDERS

Workload = Literal["pool", "sliding-window"]
MAX_VALUES = 100_000
POOL_ONLY = ("num_requests", "pool_size", "images_per_request", "zipf_exponent", "target_reuse",
             "video_pool_size", "audio_pool_size")
SW_ONLY = ("users", "turns", "window", "stride", "shared_fraction")
PLAN_AXES = (*POOL_ONLY, *SW_ONLY, "videos_per_request", "audios_per_request", "image_size",
             "seed")
#: The ``Media`` options that size a plan's videos and audio clips.
MEDIA_SIZING = ("video_size", "video_frames", "video_duration", "video_fps", "audio_sample_rate",
                "audio_duration")
LIST_HELP = "; repeat, list (1,4,10) or range start:stop[:step] (inclusive)."


def _list(flag: str, help: str, metavar: str = "LIST") -> Any:
    return option((), flag, help, kind=str, multiple=True, metavar=metavar, show_default=False)


@spec
@dataclass(frozen=True)
class AnalyzeCache:
    """The model whose entries fill the cache, the capacities asked and the cache's semantics
    (``None``: the ``--cache`` target's own rule)."""

    model: str = option("qwen3-vl-30b-a3b", "--model", "Registry name, alias or Hugging Face id "
                        "(see mmdatagen/data/models.json).")
    real_width: bool = option(False, "--real-width", "Count the real stored width (DeepStack "
                              "x4 for Qwen3-VL), not Dynamo's accounting.", is_flag=True)
    capacity_gib: tuple[str, ...] = _list(
        "--cache-gb", "Capacity in GiB (2^30 B, as Dynamo's --multimodal-embedding-cache-"
        "capacity-gb)" + LIST_HELP, "GIB")
    capacity: tuple[str, ...] = _list(
        "--cache-size", "Capacity in the --cache target's own unit (GiB, MiB for sglang-vlm, "
        "tokens for vllm-encoder); same forms as --cache-gb.", "SIZE")
    capacity_entries: tuple[str, ...] = _list(
        "--cache-images", "Capacity in entries (an LRU counting items); same forms as "
        "--cache-gb.", "N")
    key: str | None = option(None, "--key", "Item identity: encoded bytes, pixels (Dynamo "
                             "aggregated), reference string (Dynamo disaggregated), image_uuids "
                             "else bytes (vLLM). Default: the target's.", choices=KEY_MODES)
    insert: str | None = option(None, "--insert", "Entries present from scheduling (in-flight "
                                "duplicates hit) or only after the request completes (in-flight "
                                "duplicates miss). Default: the target's.",
                                choices=("schedule", "completion"))
    dispatch: str = option("file", "--dispatch", "File order, or AIPerf's causal session replay "
                           "(a session's next row only after its previous completes).",
                           choices=("file", "sessions"))
    oversize: str | None = option(None, "--oversize", "An entry larger than the cache: skipped "
                                  "(Dynamo, vLLM) or evicts everything and is not stored "
                                  "(SGLang). Default: the target's.", choices=("bypass", "flush"))


@spec
@dataclass(frozen=True)
class AnalyzeSource:
    """What is analysed: a dataset (read options) or ``--workload`` plans (or a preset's)."""

    url_image_size: str | None = option(None, "--url-image-size", "Dimensions to assume for "
                                        "http(s) URLs and uuid-only references.", metavar="WxH")
    input_format: str = option("auto", "--format", "Dataset format.",
                               choices=("auto", "single_turn", "multi_turn"))
    no_manifest: bool = option(False, "--no-manifest", "Scan the JSONL even when a manifest is "
                               "present.", is_flag=True)
    workload: Workload | None = option(None, "--workload", "Analyse a workload plan instead of "
                                       "a dataset (no pixels made).",
                                       choices=("pool", "sliding-window"))
    preset: str | None = option(None, "--config", "A generator preset (name in configs/ or "
                                "YAML path): analyse its workload; flags override it, content "
                                "keys (text, pixels, delivery) are ignored.", metavar="PRESET")


@spec
@dataclass(frozen=True)
class PlanAxes:
    """``--workload`` plan parameters; several values (or a range) make a sweep."""

    num_requests: tuple[str, ...] = _list("--num-requests", "pool: requests [1000].")
    pool_size: tuple[str, ...] = _list("--pool-size", "pool: pool size [200].")
    images_per_request: tuple[str, ...] = _list("--images-per-request",
                                                "pool: images per request [1].")
    reuse: str | None = option(None, "--reuse", "pool: reuse pattern [first-pass-unique].",
                               choices=REUSE_MODES)
    zipf_exponent: tuple[str, ...] = _list("--zipf-exponent", "pool: Zipf exponent [1.0].")
    target_reuse: tuple[str, ...] = _list("--target-reuse",
                                          "pool: best hit rate; derives the pool size.")
    users: tuple[str, ...] = _list("--users", "sliding-window: users [30].")
    turns: tuple[str, ...] = _list("--turns", "sliding-window: turns per user [8].")
    window: tuple[str, ...] = _list("--window", "sliding-window: images per turn [5].")
    stride: tuple[str, ...] = _list("--stride", "sliding-window: window shift per turn [1].")
    shared_fraction: tuple[str, ...] = _list("--shared-fraction", "sliding-window: share of "
                                             "window slots common to all users [0].")
    order: str | None = option(None, "--order", "sliding-window: row order [turn-major].",
                               choices=ROW_ORDERS)
    videos_per_request: tuple[str, ...] = _list("--videos-per-request", "Videos per request "
                                                "(pool: own pool; sliding-window: own window) "
                                                "[0].")
    audios_per_request: tuple[str, ...] = _list("--audios-per-request", "Audio clips per "
                                                "request [0].")
    video_pool_size: tuple[str, ...] = _list("--video-pool-size", "pool: distinct videos "
                                             "[--pool-size].")
    audio_pool_size: tuple[str, ...] = _list("--audio-pool-size", "pool: distinct audio clips "
                                             "[--pool-size].")
    image_size: tuple[str, ...] = _list("--image-size", "Workload image size WxH or weighted "
                                        "list [pool 640x480, sliding-window 2400x1080]; repeat "
                                        "to sweep.", "WxH")
    seed: tuple[str, ...] = _list("--seed", "Plan seed [0]; several to see spread.")

    def given(self) -> list[str]:
        """The plan parameters given (by field name)."""
        return [k for k in PLAN_AXES if getattr(self, k)]


@spec
@dataclass(frozen=True)
class AnalyzeOutput:
    curve_path: Path | None = option(None, "--curve", "Write the full curve (every capacity "
                                     "where the hit count changes): .csv or .json.", kind=Path,
                                     dir_okay=False)
    plot_path: Path | None = option(None, "--plot", "Draw hit rate against cache size (PNG; "
                                    "needs matplotlib).", kind=Path, dir_okay=False)
    as_json: bool = option(False, "--json", "Print JSON instead of the report.", is_flag=True)
    quiet: bool = quiet("No progress bar.")
    force: bool = option(False, "--force", "Overwrite an existing --curve / --plot file.",
                         short="-f", is_flag=True)

    @property
    def want_curve(self) -> bool:
        return self.curve_path is not None or self.plot_path is not None


@dataclass(frozen=True)
class AnalyzeRequest:
    """One ``analyze`` run: a dataset or plans, the model and cache, the outputs."""

    dataset: Path | None
    cache: AnalyzeCache
    model: AnalyzeModel
    geometry: Geometry
    source: AnalyzeSource
    axes: PlanAxes
    output: AnalyzeOutput
    media: Media

    @classmethod
    def of(cls, dataset: Path | None, values: Mapping[str, Any]) -> AnalyzeRequest:
        """Every part built and validated from one mapping of option values."""
        req = cls(dataset, build(AnalyzeCache, values), build(AnalyzeModel, values),
                  build(Geometry, values), build(AnalyzeSource, values), build(PlanAxes, values),
                  build(AnalyzeOutput, values), build(Media, values))
        req.check()
        return req

    def check(self) -> None:
        m = self.model
        if (m.tokens_per_image is None) != (m.bytes_per_token is None):
            raise SpecError("tokens_per_image", "and --bytes-per-token go together")
        for part in (self.cache, self.axes):
            for name in KINDS:
                if hasattr(part, name):
                    numbers(getattr(part, name), name)  # every list parses, or one error
        given = self.axes.given() + [k for k in MEDIA_SIZING if getattr(self.media, k) is not None]
        if self.dataset is not None and given:
            raise SpecError(given[0], "applies to --workload, not to a dataset")


#: The number kind of every list-valued option (plan axes and capacities).
KINDS: dict[str, type] = {
    "capacity_gib": float, "capacity": float, "capacity_entries": int, "num_requests": int,
    "pool_size": int, "images_per_request": int, "zipf_exponent": float, "target_reuse": float,
    "video_pool_size": int, "audio_pool_size": int, "users": int, "turns": int, "window": int,
    "stride": int, "shared_fraction": float, "videos_per_request": int,
    "audios_per_request": int, "seed": int}


def numbers(values: tuple[str, ...], name: str) -> list:
    """Expand field ``name``'s ``1 2.5 0:20:2 5,6`` (repeatable; ranges include their end) into
    numbers of its kind (``KINDS``); a bad value is a ``SpecError`` naming the field."""
    kind = KINDS[name]
    out: list = []
    for raw in values:
        items = [s.strip() for s in str(raw).split(",") if s.strip()]
        if not items:
            raise SpecError(name, f"takes numbers, got {raw!r}")
        for item in items:
            out += _expand(item, kind, name)
    if any(v < 0 for v in out):
        raise SpecError(name, "must not be negative")
    return out


def _expand(item: str, kind: type, name: str) -> list:
    try:
        if ":" not in item:
            vals = [kind(item)]
        else:
            vals = _range(item, [kind(p) for p in item.split(":")], kind, name)
        if not all(math.isfinite(v) for v in vals):
            raise ValueError
        return vals
    except (ValueError, OverflowError):
        raise SpecError(name, f"has a bad value {item!r}; expected a number, a list 1,2,4 or a "
                        "range start:stop[:step]") from None


def _range(item: str, parts: list, kind: type, name: str) -> list:
    if len(parts) not in (2, 3) or (len(parts) == 3 and parts[2] <= 0):
        raise ValueError
    lo, hi = parts[0], parts[1]
    step = parts[2] if len(parts) == 3 else 1
    count = int((hi - lo) / step + 1e-9) + 1
    if count < 1:
        raise SpecError(name, f"range {item!r} is empty (start above stop)")
    if count > MAX_VALUES:
        raise SpecError(name, f"range {item!r} has more than {MAX_VALUES:,} values")
    return [kind(round(lo + i * step, 9)) for i in range(count)]
