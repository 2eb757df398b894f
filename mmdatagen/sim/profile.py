"""Simulator profiles: the engine-model parameters of one (model, hardware, engine) combination.

Profiles are YAML files in ``configs/profiles/``; unknown keys are an error so typos surface.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field, fields, replace
from typing import Any

from ..caches.targets import DEFAULT_TARGET, CacheTarget, get_target
from ..errors import UserError
from ..io.imageref import KEY_MODES
from ..presets import find_config, load_yaml

REGISTER_MODES = ("schedule", "encode", "completion")


@dataclass(frozen=True)
class Profile:
    """Parameters of the step model (all times in milliseconds of simulated time).

    Step duration = ``step_base_ms`` + ``per_seq_ms`` x running sequences
    + ``per_decode_context_ms`` x their prompts in thousands of tokens
    + ``per_prefill_token_ms`` x prefill tokens + ``per_prefill_context_ms`` x each prefill
    token's causal context in thousands (a chunk of ``c`` tokens after ``o``: ``c (o + c / 2)``;
    a whole prompt of ``T``: ``T^2 / 2``) + ``per_prefill_request_ms`` x requests with prompt
    tokens in the step + ``per_encoder_token_ms`` x encoded image tokens
    + ``per_encoder_image_ms`` x encoded images, of which ``encoder_async_fraction`` runs instead
    on a serial encoder queue beside the steps (delaying only that request's prefill). Before
    the engine, a serial frontend spends
    ``frontend_request_ms`` + ``frontend_image_ms`` x images per request, after a fixed
    ``url_fetch_ms`` per http(s) image (not serial). Decoding an image costs
    ``decode_ms_per_mpixel`` x its megapixels: on the serial frontend when ``decode_workers`` is
    0 (vLLM's API server decodes in its one process), else on a pool of that many decoders
    ahead of it (Dynamo's frontend decoding: the images of every request decode in parallel,
    off the engine's serial path).
    """

    name: str = "custom"
    description: str = ""
    model: str = "qwen3-vl-30b-a3b"
    served_model_name: str = "Qwen/Qwen3-VL-30B-A3B-Instruct-FP8"
    max_running: int = 256
    token_budget: int = 8192
    step_base_ms: float = 5.0
    per_seq_ms: float = 0.1
    per_prefill_token_ms: float = 0.0
    #: attention's quadratic part: ms per prefill token per 1,000 tokens of the prompt before it
    per_prefill_context_ms: float = 0.0
    #: decode attention: ms per decoding sequence per 1,000 tokens of its prompt
    per_decode_context_ms: float = 0.0
    #: the engine's own work per request with prompt tokens in a step (building its inputs):
    #: unlike the frontend's work, it does not overlap the steps
    per_prefill_request_ms: float = 0.0
    per_encoder_token_ms: float = 0.0
    per_encoder_image_ms: float = 0.0
    encoder_async_fraction: float = 0.0
    frontend_request_ms: float = 0.0
    frontend_image_ms: float = 0.0
    url_fetch_ms: float = 0.0
    decode_ms_per_mpixel: float = 0.0
    decode_workers: int = 0
    default_image_size: tuple[int, int] = (640, 480)
    cache: str = DEFAULT_TARGET
    key_mode: str | None = None
    register: str | None = None
    #: a two-tier target's front (vLLM's encoder cache) in tokens; None: vLLM's rule
    encoder_budget: int | None = None
    #: the engine also keeps vLLM's encoder cache behind a cache looked up on arrival (plain
    #: vLLM: the processor cache skips preprocessing, the encoder cache skips encoding); its
    #: budget is ``encoder_budget``, else vLLM's rule with ``token_budget`` and ``max_model_len``
    encoder_cache: bool = False
    natural_output_tokens: int = 128
    max_model_len: int = 262144
    max_body_mb: float = 64.0
    text_bytes_per_token: float = 4.0
    calibration: dict[str, Any] = field(default_factory=dict, compare=False, hash=False)

    @property
    def zero_delay(self) -> bool:
        """True when no work costs time: requests complete as soon as they are parsed."""
        return not any((self.step_base_ms, self.per_seq_ms, self.per_prefill_token_ms,
                        self.per_prefill_context_ms, self.per_decode_context_ms,
                        self.per_prefill_request_ms,
                        self.per_encoder_token_ms, self.per_encoder_image_ms,
                        self.frontend_request_ms, self.frontend_image_ms, self.url_fetch_ms,
                        self.decode_ms_per_mpixel))

    def validate(self) -> Profile:
        """Every field's type, finiteness and range (a YAML file, ``--sim-arg`` or a sweep's
        ``--sim-param`` gave it): one line naming the field."""
        for f in fields(self):
            v = getattr(self, f.name)
            problem = _type_problem(str(f.type), v)
            if problem is not None:
                raise UserError(f"profile {self.name}: {f.name} {problem} (got {v!r:.40})")
            if isinstance(v, (int, float)) and not isinstance(v, bool) and v < 0:
                raise UserError(f"profile {self.name}: {f.name} must not be negative")
        if self.max_running < 1 or self.token_budget < 1:
            raise UserError(f"profile {self.name}: max_running and token_budget must be >= 1")
        if self.key_mode is not None and self.key_mode not in KEY_MODES:
            raise UserError(f"profile {self.name}: key_mode must be one of {', '.join(KEY_MODES)}")
        if self.register is not None and self.register not in REGISTER_MODES:
            raise UserError(f"profile {self.name}: register must be one of {', '.join(REGISTER_MODES)}")
        self.cache_target()
        if not 0.0 <= self.encoder_async_fraction <= 1.0:
            raise UserError(f"profile {self.name}: encoder_async_fraction must be in [0, 1]")
        if self.text_bytes_per_token <= 0:
            raise UserError(f"profile {self.name}: text_bytes_per_token must be positive")
        return self

    def cache_target(self) -> CacheTarget:
        """The cache this profile's engine runs: its target, with the profile's key mode and
        registration moment where it sets them (only schedule-time caches can move it)."""
        target = get_target(self.cache)
        changes: dict[str, Any] = {}
        if self.key_mode is not None:
            changes["key"] = self.key_mode
        if self.register is not None and self.register != target.present:
            if target.lookup != "schedule" or target.releases:
                raise UserError(f"profile {self.name}: register cannot be changed for cache "
                                f"{target.name}")
            changes["present"] = self.register
        return replace(target, **changes) if changes else target

    def for_cache(self, name: str | None) -> Profile:
        """This profile running another cache target (its key/register overrides dropped)."""
        if name is None or get_target(name).name == get_target(self.cache).name:
            return self
        return replace(self, cache=get_target(name).name, key_mode=None, register=None).validate()

    def with_overrides(self, **kw: Any) -> Profile:
        """A copy with some fields replaced (None values ignored), validated."""
        kw = {k: v for k, v in kw.items() if v is not None}
        return replace(self, **kw).validate()


_FIELDS = {f.name for f in fields(Profile)}


def _type_problem(kind: str, v: Any) -> str | None:
    """Why ``v`` is not a value of the annotated field type ``kind``, or None."""
    if v is None and kind.endswith("| None"):
        return None
    base = kind.removesuffix(" | None")
    number = isinstance(v, (int, float)) and not isinstance(v, bool)
    if base == "int" and not (number and isinstance(v, int)):
        return "must be an integer"
    if base == "float" and not (number and math.isfinite(v)):
        return "must be a number (finite)"
    if base == "str" and not isinstance(v, str):
        return "must be a string"
    if base == "tuple[int, int]" and not (isinstance(v, tuple) and len(v) == 2 and all(
            isinstance(x, int) and not isinstance(x, bool) and x > 0 for x in v)):
        return "must be two positive integers (width, height)"
    return None


def profile_from_dict(data: dict[str, Any], name: str = "custom") -> Profile:
    """Build a profile from a mapping (YAML), rejecting unknown keys."""
    unknown = sorted(set(data) - _FIELDS)
    if unknown:
        raise UserError(f"profile {name}: unknown keys {', '.join(unknown)}")
    data = dict(data)
    data.setdefault("name", name)
    size = data.get("default_image_size")
    if size is not None:
        if not (isinstance(size, (list, tuple)) and len(size) == 2
                and all(isinstance(x, int) and x > 0 for x in size)):
            raise UserError(f"profile {name}: default_image_size must be [width, height]")
        data["default_image_size"] = tuple(size)
    try:
        prof = Profile(**data)
    except TypeError as exc:
        raise UserError(f"profile {name}: {exc}") from None
    return prof.validate()


def load_profile(name_or_path: str) -> Profile:
    """A shipped profile by name (``configs/profiles/<name>.yaml``) or a YAML file path."""
    path = find_config(name_or_path, "profiles")
    data = load_yaml(path)
    return profile_from_dict(data, name=path.stem)
