"""``analyze``'s options: what to analyse (a dataset or workload plans, possibly a sweep), the
cache and its semantics, the outputs. ``AnalyzeRequest`` is the whole request the library runs
(``analysis.run``); lists and ranges (``1,4,10``, ``0:20:2``) are expanded by :func:`numbers`
(``settings.values``' one list syntax).
"""
from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

from ..errors import SpecError
from .base import build, expand, list_option, option, spec
from .cache import KEY_MODES, SIZE_MAX, AnalyzeModel, Geometry
from .common import quiet
from .content import Media
from .values import LIST_HELP
from .workload import DATASET_TYPES, REUSE_MODES, ROW_ORDERS

Workload = Literal["pool", "sliding-window"]
POOL_ONLY = ("num_requests", "pool_size", "images_per_request", "zipf_exponent", "target_reuse",
             "video_pool_size", "audio_pool_size")
SW_ONLY = ("users", "turns", "window", "stride", "shared_fraction")
PLAN_AXES = (*POOL_ONLY, *SW_ONLY, "videos_per_request", "audios_per_request", "image_size",
             "seed")
#: The ``Media`` options that size a plan's videos and audio clips.
MEDIA_SIZING = ("video_size", "video_frames", "video_duration", "video_fps", "audio_sample_rate",
                "audio_duration")


@spec
@dataclass(frozen=True)
class AnalyzeCache:
    """The model whose entries fill the cache, the capacities asked and the cache's semantics
    (``None``: the ``--cache`` target's own rule)."""

    model: str = option("qwen3-vl-30b-a3b", "--model", "Registry name, alias or Hugging Face id "
                        "(see mmdatagen/data/models.json).")
    real_width: bool = option(False, "--real-width", "Count the real stored width (DeepStack "
                              "x4 for Qwen3-VL), not Dynamo's accounting.", is_flag=True)
    cache_size: tuple[str, ...] = list_option(
        "--cache-size", "Capacity in the --cache target's own unit (GiB: 2^30 B, as Dynamo's "
        "--multimodal-embedding-cache-capacity-gb; MiB for sglang-vlm; tokens for "
        "vllm-encoder)" + LIST_HELP, float, "SIZE", max=SIZE_MAX, aliases=("--cache-gb",))
    cache_images: tuple[str, ...] = list_option(
        "--cache-images", "Capacity in entries (an LRU counting items, whatever their size); "
        "same forms as --cache-size.", int, "N", max=10**9)
    key: str | None = option(None, "--key", "Item identity: encoded bytes, pixels (Dynamo "
                             "aggregated), reference string (Dynamo disaggregated), image_uuids "
                             "else bytes (vLLM). Default: the target's.", choices=KEY_MODES,
                             aliases=("--key-mode",))
    register: str | None = option(None, "--register", "When a missed item enters the cache: "
                                  "at scheduling (in-flight duplicates hit) or only after the "
                                  "request completes (in-flight duplicates miss). Default: the "
                                  "target's.", choices=("schedule", "completion"),
                                  aliases=("--insert",))
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
    dataset_type: str = option("auto", "--custom-dataset-type", "Dataset format; auto tells "
                               "single_turn from multi_turn.", choices=("auto", *DATASET_TYPES),
                               aliases=("--format",))
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

    num_requests: tuple[str, ...] = list_option("--num-requests", "pool: requests [1000].", item=int)
    pool_size: tuple[str, ...] = list_option("--pool-size", "pool: pool size [200].", item=int)
    images_per_request: tuple[str, ...] = list_option("--images-per-request",
                                                "pool: images per request [1].", item=int)
    reuse: str | None = option(None, "--reuse", "pool: reuse pattern [first-pass-unique].",
                               choices=REUSE_MODES)
    zipf_exponent: tuple[str, ...] = list_option("--zipf-exponent", "pool: Zipf exponent [1.0].", item=float)
    target_reuse: tuple[str, ...] = list_option("--target-reuse",
                                          "pool: best hit rate; derives the pool size.", item=float)
    users: tuple[str, ...] = list_option("--users", "sliding-window: users [30].", item=int)
    turns: tuple[str, ...] = list_option("--turns", "sliding-window: turns per user [8].", item=int)
    window: tuple[str, ...] = list_option("--window", "sliding-window: images per turn [5].", item=int)
    stride: tuple[str, ...] = list_option("--stride", "sliding-window: window shift per turn [1].", item=int)
    shared_fraction: tuple[str, ...] = list_option("--shared-fraction", "sliding-window: share of "
                                             "window slots common to all users [0].", item=float)
    order: str | None = option(None, "--order", "sliding-window: row order [turn-major].",
                               choices=ROW_ORDERS)
    videos_per_request: tuple[str, ...] = list_option("--videos-per-request", "Videos per request "
                                                "(pool: own pool; sliding-window: own window) "
                                                "[0].", item=int)
    audios_per_request: tuple[str, ...] = list_option("--audios-per-request", "Audio clips per "
                                                "request [0].", item=int)
    video_pool_size: tuple[str, ...] = list_option("--video-pool-size", "pool: distinct videos "
                                             "[--pool-size].", item=int)
    audio_pool_size: tuple[str, ...] = list_option("--audio-pool-size", "pool: distinct audio clips "
                                             "[--pool-size].", item=int)
    image_size: tuple[str, ...] = option((), "--image-size", "Workload image size WxH or "
                                         "weighted list [pool 640x480, sliding-window "
                                         "2400x1080]; repeat to sweep.", kind=str,
                                         multiple=True, metavar="WxH", show_default=False)
    seed: tuple[str, ...] = list_option("--seed", "Plan seed [0]; several to see spread.", item=int)

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
            raise SpecError("tokens_per_image", "and `bytes_per_token` go together")
        given = self.axes.given() + [k for k in MEDIA_SIZING if getattr(self.media, k) is not None]
        if self.dataset is not None and given:
            raise SpecError(given[0], "applies to `workload`, not to a dataset")


def numbers(values: tuple[str, ...], name: str) -> list:
    """Field ``name``'s list (a capacity or plan parameter of ``analyze``) expanded: the one
    list syntax of ``settings.values``, numbers of the field's kind, each in its bounds; a bad value
    is a ``SpecError`` naming the field."""
    return expand(PlanAxes if hasattr(PlanAxes, name) else AnalyzeCache, name, values)
