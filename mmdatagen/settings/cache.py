"""Cache-target, capacity and model-geometry options.

A cache target (``--cache``, the names of ``data/caches.json``) says which engine cache is sized;
``--cache-size`` (field ``cache_size`` on every command; ``--cache-gb`` is an older spelling) is
its capacity in that cache's own unit (``CacheTarget.unit``: GiB, MiB or embedding tokens), a
list where the command sweeps it (``analyze``, ``simulate``, ``sweep``). ``analyze``'s
``--cache-images`` is the one capacity in another unit: entries, for an LRU counting items. The
keying (``--key``) and the moment a missed item enters the cache (``--register``) have one flag
each too. The model geometry that sizes entries comes from the registry, a local Hugging Face
folder (``--model-path``) or the geometry flags.
"""
from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

from ..errors import SpecError
from .base import build, expand, list_option, option, spec

KeyMode = Literal["bytes", "pixels", "reference", "uuid"]
Register = Literal["schedule", "encode", "completion"]

KEY_MODES: tuple[str, ...] = ("bytes", "pixels", "reference", "uuid")
REGISTER: tuple[str, ...] = ("schedule", "encode", "completion")
SIZE_MAX = 1e12  # capacities in tokens get large
TARGETS: tuple[str, ...] = ("dynamo-embedding", "dynamo-connector", "dynamo-encode",
                            "vllm-processor", "vllm-processor-shm", "vllm-encoder", "sglang-vlm")
DTYPES: tuple[str, ...] = ("bfloat16", "float16", "float32", "fp8")
CACHE_HELP = ("Cache target: dynamo-embedding, dynamo-connector, dynamo-encode, vllm-processor, "
              "vllm-processor-shm, vllm-encoder, sglang-vlm (README: 'Which cache are you "
              "sizing?').")
FRONT_HELP = ("Two-tier Dynamo targets (dynamo-embedding, dynamo-connector): vLLM's encoder "
              "cache in front, in embedding tokens, as the engine's startup log prints it "
              "('Encoder cache will be initialized with a budget of N tokens'). Default: vLLM's "
              "rule for the model.")
ENCODER_BUDGET_MAX = 10**9
SIZE_HELP = "Capacity in the target's own unit (GiB, MiB for sglang-vlm, tokens for vllm-encoder)"
#: Older spellings of ``--cache-size`` (hidden; the value is in the target's unit all the same).
SIZE_ALIASES = ("--cache-gb", "--embedding-cache-gb")
KEY_HELP = ("Cache key: encoded bytes (vLLM), pixels (Dynamo aggregated), reference string "
            "(Dynamo disaggregated), uuid.")
REGISTER_HELP = "When a missed item enters the cache: at scheduling, after its encode step, or " \
                "at request completion."


@spec
@dataclass(frozen=True)
class Geometry:
    """The model geometry that sizes cache entries, for a model the registry does not know (or
    to override the registry's values)."""

    model_path: Path | None = option(None, "--model-path", "A local Hugging Face model folder "
                                     "(config.json + preprocessor_config.json): its geometry "
                                     "sizes the cache entries.", kind=Path, file_okay=False)
    patch_size: int | None = option(None, "--patch-size", "Vision patch size in pixels.",
                                    kind=int, min=1, max=1024)
    merge_size: int | None = option(None, "--merge-size", "Spatial merge size (patches per "
                                    "token side).", kind=int, min=1, max=64)
    temporal_patch_size: int | None = option(None, "--temporal-patch-size", "Frames per "
                                             "temporal patch.", kind=int, min=1, max=64)
    min_pixels: int | None = option(None, "--min-pixels", "Smallest resized image (pixels).",
                                    kind=int, min=1, max=10**12)
    max_pixels: int | None = option(None, "--max-pixels", "Largest resized image (pixels).",
                                    kind=int, min=1, max=10**12)
    hidden_size: int | None = option(None, "--hidden-size", "Language-model hidden size "
                                     "(embedding width).", kind=int, min=1, max=1_000_000)
    dtype: str | None = option(None, "--dtype", "Embedding dtype.", choices=DTYPES)

    def values(self) -> dict[str, int]:
        """The given geometry values as ``vlm.resolve_model`` keywords."""
        from ..vlm import DTYPE_BYTES

        out = {k: getattr(self, k) for k in ("patch_size", "merge_size", "temporal_patch_size",
                                             "min_pixels", "max_pixels", "hidden_size")
               if getattr(self, k) is not None}
        if self.dtype is not None:
            out["dtype_bytes"] = DTYPE_BYTES[self.dtype]
        return out


@spec
@dataclass(frozen=True)
class SimCache:
    """The simulator's embedding cache (``serve``, ``simulate``)."""

    cache: str | None = option(None, "--cache", CACHE_HELP + " Default: the profile's.",
                               choices=TARGETS)
    cache_size: float | None = option(None, "--cache-size", SIZE_HELP + "; 0 = off. Default: "
                                      "the target's (10 GiB for Dynamo's, vLLM's own defaults "
                                      "for vLLM's).", kind=float, min=0, max=SIZE_MAX,
                                      aliases=SIZE_ALIASES)
    key: KeyMode | None = option(None, "--key", KEY_HELP + " Default: profile's.",
                                 choices=KEY_MODES, aliases=("--key-mode",))
    register: Register | None = option(None, "--register", REGISTER_HELP + " Default: "
                                       "profile's.", choices=REGISTER, aliases=("--insert",))
    encoder_budget: int | None = option(None, "--encoder-budget", FRONT_HELP + " Simulator "
                                        "default: the rule with the profile's token budget.",
                                        kind=int, min=1, max=ENCODER_BUDGET_MAX)


@spec
@dataclass(frozen=True)
class SweepCache:
    """``simulate --cache-size``: one size is the run's cache; several are a what-if
    (``sim.whatif``: one virtual run each, with intervals from a calibrated profile), printed
    as a table (and sweep.json plus report.html in --output-dir) instead of one run's export."""

    cache_size: tuple[str, ...] = list_option(
        "--cache-size", SIZE_HELP + "; 0 = off. Several sizes (a list 0,0.5,10 or a range "
        "start:stop[:step]) are a what-if: one virtual run each, printed as a table with "
        "intervals when the profile was calibrated (and sweep.json plus report.html in "
        "--output-dir). Default: the target's.", float, "SIZE", max=SIZE_MAX,
        aliases=(*SIZE_ALIASES, "--sweep-cache-gb"))
    slo: str | None = option(None, "--slo", "What-if objective STAT:MS (STAT ttft_avg, ttft_p50 "
                             "or ttft_p99) for several --cache-size: the smallest size meeting "
                             "it is printed and marked in the report.", metavar="STAT:MS")

    def sizes(self) -> list[float]:
        return expand(SweepCache, "cache_size", self.cache_size)


def simulate_caches(values: Mapping[str, Any]) -> tuple[SimCache, SweepCache]:
    """``simulate``'s cache options: one ``--cache-size`` sizes the run's cache (the
    :class:`SimCache` a ``serve`` would take), several sweep it (an empty :class:`SweepCache`
    when there is nothing to sweep)."""
    sweep = build(SweepCache, values)
    sizes = sweep.sizes()
    one = sizes[0] if len(sizes) == 1 else None
    if sweep.slo is not None and len(sizes) < 2:
        raise SpecError("slo", "needs several `cache_size` values (a what-if sweep)")
    return build(SimCache, values, cache_size=one), sweep if len(sizes) > 1 else SweepCache()


@spec
@dataclass(frozen=True)
class BenchCache:
    """``bench``: the embedded simulator's cache and the predicted hits."""

    cache: str | None = option(None, "--cache", CACHE_HELP + " The embedded simulator runs it "
                               "and the prediction sizes it. Default: dynamo-embedding.",
                               choices=TARGETS)
    cache_size: float | None = option(None, "--cache-size", SIZE_HELP + ": the embedded "
                                      "simulator's, and the predicted hits'. Default: the "
                                      "target's.", kind=float, min=0, max=SIZE_MAX,
                                      aliases=SIZE_ALIASES)
    encoder_budget: int | None = option(None, "--encoder-budget", FRONT_HELP, kind=int, min=1,
                                        max=ENCODER_BUDGET_MAX)

    @property
    def target_name(self) -> str:
        """The cache target the prediction sizes (``cache``, else Dynamo's embedding cache)."""
        from ..caches import DEFAULT_TARGET

        return self.cache or DEFAULT_TARGET


@spec
@dataclass(frozen=True)
class AbCache:
    """``ab``: each run's cache."""

    a_cache_size: float = option(10.0, "--a-cache-size", "Run A's cache size, in the profile's "
                                 "cache target's unit (GiB for Dynamo's).", min=0, max=SIZE_MAX,
                                 aliases=("--a-cache-gb",))
    b_cache_size: float = option(0.0, "--b-cache-size", "Run B's cache size.", min=0,
                                 max=SIZE_MAX, aliases=("--b-cache-gb",))


@spec
@dataclass(frozen=True)
class AnalyzeModel:
    """``analyze``: the model geometry and the concurrency model of the prediction."""

    cache: str = option("dynamo-embedding", "--cache", CACHE_HELP, choices=TARGETS)
    encoder_budget: int | None = option(None, "--encoder-budget", FRONT_HELP, kind=int, min=1,
                                        max=ENCODER_BUDGET_MAX)
    tokens_per_image: int | None = option(None, "--tokens-per-image", "Generic model: fixed "
                                          "tokens per image.", kind=int, min=1, max=10_000_000)
    bytes_per_token: int | None = option(None, "--bytes-per-token", "Generic model: cache bytes "
                                         "per token.", kind=int, min=1, max=10_000_000)
    in_flight: int = option(1, "--in-flight", "Requests (file order) or sessions (--dispatch "
                            "sessions) in flight; they complete first-in first-out.", min=1,
                            max=1_000_000)
