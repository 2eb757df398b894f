"""Workload specs: what the plan is made of (``pool``, ``sliding-window``)."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from .base import SpecError, option, spec

ReuseMode = Literal["first-pass-unique", "uniform", "zipf", "cyclic"]
RowOrder = Literal["turn-major", "user-major", "random"]
TextSharing = Literal["row", "user", "all"]
DatasetType = Literal["single_turn", "multi_turn"]

REUSE_MODES: tuple[str, ...] = ("first-pass-unique", "uniform", "zipf", "cyclic")
ROW_ORDERS: tuple[str, ...] = ("turn-major", "user-major", "random")
TEXT_SHARING: tuple[str, ...] = ("row", "user", "all")
#: AIPerf's custom dataset types a generator writes (and, with auto, a reader reads).
DATASET_TYPES: tuple[str, ...] = ("single_turn", "multi_turn")

#: A plan holds one int64 per image reference (plus a few per row): above this many references
#: it would need gigabytes before the first row is written, so it is refused up front.
MAX_REFERENCES = 100_000_000
DEFAULT_POOL_SIZE = 200
COUNT_MAX = 100_000_000


def check_references(name: str, refs: int, what: str) -> None:
    if refs > MAX_REFERENCES:
        gib = refs * 8 / 2**30
        raise SpecError(name, f"makes a plan of {refs:,} image references ({what}; "
                        f"{gib:.1f} GiB for the plan alone); at most {MAX_REFERENCES:,}")


@spec
@dataclass(frozen=True)
class PoolWorkload:
    """Single-turn rows drawing images from a pool with controlled reuse."""

    num_requests: int = option(1000, "--num-requests", "Rows (requests).", short="-n", min=1,
                               max=COUNT_MAX)
    pool_size: int | None = option(None, "--pool-size", "Distinct images [default: 200; "
                                   "with --target-reuse: derived].", kind=int, min=1, max=COUNT_MAX)
    images_per_request: int = option(1, "--images-per-request", "Images per row.", min=0,
                                     max=10_000)
    videos_per_request: int = option(0, "--videos-per-request", "Video items per request (their "
                                     "own pool, same reuse rule).", min=0, max=10_000)
    audios_per_request: int = option(0, "--audios-per-request", "Audio items per request (their "
                                     "own pool, same reuse rule).", min=0, max=10_000)
    video_pool_size: int | None = option(None, "--video-pool-size", "Distinct videos (default: "
                                         "--pool-size).", kind=int, min=1, max=COUNT_MAX)
    audio_pool_size: int | None = option(None, "--audio-pool-size", "Distinct audios (default: "
                                         "--pool-size).", kind=int, min=1, max=COUNT_MAX)
    reuse: ReuseMode = option("first-pass-unique", "--reuse",
                              "How slots draw from the pool (first-pass-unique: the seeds' rule).",
                              choices=REUSE_MODES)
    zipf_exponent: float = option(1.0, "--zipf-exponent", "Zipf exponent (--reuse zipf).",
                                  min=0, min_open=True, max=100)
    target_reuse: float | None = option(None, "--target-reuse",
                                        "Best-possible hit rate to reach; derives the pool size "
                                        "(first-pass-unique).", kind=float, min=0, max=1,
                                        max_open=True)

    def check(self) -> None:
        if self.target_reuse is not None and self.pool_size is not None:
            raise SpecError("target_reuse", "derives the pool size; give it or `pool_size`, "
                            "not both")
        items = self.images_per_request + self.videos_per_request + self.audios_per_request
        if items == 0:
            raise SpecError("images_per_request", "and `videos_per_request`, "
                            "`audios_per_request` add up to 0: a request needs at least one "
                            "image, video or audio")
        check_references("num_requests", self.num_requests * items,
                         "requests x items per request")
        pool = self.resolved_pool_size()
        if self.images_per_request > pool:
            raise SpecError("images_per_request", f"({self.images_per_request}) exceeds the pool "
                            f"size ({pool}); a row never repeats an image")

    def resolved_pool_size(self) -> int:
        """``--pool-size``, or the size ``--target-reuse`` derives, or the default 200."""
        if self.target_reuse is not None:
            from ..plans.pool import pool_size_for_reuse

            return pool_size_for_reuse(self.num_requests, max(1, self.images_per_request),
                                       self.target_reuse)
        return DEFAULT_POOL_SIZE if self.pool_size is None else self.pool_size

    def plan_args(self) -> dict:
        """The plan's arguments; the media ones only when used (they are recorded only then)."""
        media = {k: getattr(self, k) for k in ("videos_per_request", "audios_per_request",
                                               "video_pool_size", "audio_pool_size")}
        return {"num_requests": self.num_requests, "pool_size": self.resolved_pool_size(),
                "images_per_request": self.images_per_request, "reuse": self.reuse,
                "zipf_exponent": self.zipf_exponent, "target_reuse": self.target_reuse,
                **{k: v for k, v in media.items() if v}}


@spec
@dataclass(frozen=True)
class SlidingWindowWorkload:
    """Per-user sessions whose consecutive turns share images."""

    users: int = option(30, "--users", "Users (sessions).", min=1, max=COUNT_MAX)
    turns: int = option(8, "--turns", "Turns per user.", min=1, max=COUNT_MAX)
    window: int = option(5, "--window", "Images per request.", min=0, max=10_000)
    videos_per_request: int = option(0, "--videos-per-request", "Video window per request (each "
                                     "user's own videos slide by --stride).", min=0, max=10_000)
    audios_per_request: int = option(0, "--audios-per-request", "Audio window per request (each "
                                     "user's own audios slide by --stride).", min=0, max=10_000)
    stride: int = option(1, "--stride", "New images per turn.", min=0, max=COUNT_MAX)
    order: RowOrder = option("turn-major", "--order", "Row order (random: seeded interleave).",
                             choices=ROW_ORDERS)
    shared_fraction: float = option(0.0, "--shared-fraction", "Share of each window drawn from "
                                    "one sequence common to all users.", min=0, max=1)
    text_sharing: TextSharing = option("row", "--text-sharing", "Fresh text per row, one per "
                                       "user, or one for all rows.", choices=TEXT_SHARING)
    dataset_type: DatasetType = option("single_turn", "--custom-dataset-type", "The AIPerf "
                                       "dataset type written: single_turn with session_id "
                                       "(causal replay) or multi_turn sessions.",
                                       choices=DATASET_TYPES, aliases=("--format",))

    def check(self) -> None:
        items = self.window + self.videos_per_request + self.audios_per_request
        if items == 0:
            raise SpecError("window", "and `videos_per_request`, `audios_per_request` add up to "
                            "0: a request needs at least one image, video or audio")
        check_references("users", self.users * self.turns * items,
                         "users x turns x items per request")
        images = self.users * (items + (self.turns - 1) * self.stride)
        if images > MAX_REFERENCES:
            raise SpecError("users", f"x (window + (turns - 1) x stride) makes {images:,} "
                            f"distinct images; at most {MAX_REFERENCES:,}")

    def plan_args(self) -> dict:
        return {"users": self.users, "turns": self.turns, "window": self.window,
                "stride": self.stride, "order": self.order,
                "shared_fraction": self.shared_fraction, "text_sharing": self.text_sharing,
                **{k: v for k in ("videos_per_request", "audios_per_request")
                   if (v := getattr(self, k))}}
