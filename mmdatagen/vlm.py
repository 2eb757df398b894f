"""Model registry: image tokens and embedding-cache bytes per image, shared by analysis and simulator.

The registry itself is data (``data/models.json``); this module only applies the resize rule.
"""
from __future__ import annotations

import json
import math
from dataclasses import dataclass, replace
from functools import lru_cache
from importlib import resources
from pathlib import Path
from typing import Any

from .errors import SpecError, UserError

MAX_ASPECT_RATIO = 200
GRID_BYTES = 24  # the int64 (t, h, w) grid stored beside the pixel values


@dataclass(frozen=True)
class VisionModel:
    """One vision-language model: how it turns an image into tokens and cache bytes.

    ``tokens_per_image`` set means a generic model with a fixed token count per image.
    """

    name: str
    hidden_size: int
    hf_id: str = ""
    family: str = "generic"
    patch_size: int = 16
    merge_size: int = 2
    min_pixels: int = 0
    max_pixels: int = 1 << 62
    dtype_bytes: int = 2
    deepstack_factor: int = 1
    tokenizer: str | None = None
    tokens_per_image: int | None = None
    temporal_patch_size: int = 2
    in_channels: int = 3
    pixel_dtype_bytes: int = 1  # processed pixel values are kept as uint8 (vLLM's default)
    video_min_pixels: int | None = None  # the video processor's own per-frame limits, when a
    video_max_pixels: int | None = None  # checkpoint has them (None: the image limits)

    @property
    def factor(self) -> int:
        return self.patch_size * self.merge_size

    @property
    def bytes_per_token(self) -> int:
        """Accounted cache bytes per image token (what Dynamo's capacity counts)."""
        return self.hidden_size * self.dtype_bytes

    def resized(self, width: int, height: int) -> tuple[int, int]:
        """The (width, height) the processor resizes an image to (smart_resize)."""
        if width <= 0 or height <= 0:
            raise UserError(f"image size must be positive, got {width}x{height}")
        if max(width, height) / min(width, height) > MAX_ASPECT_RATIO:
            raise UserError(f"aspect ratio of {width}x{height} exceeds {MAX_ASPECT_RATIO}")
        f = self.factor
        h = max(f, round(height / f) * f)
        w = max(f, round(width / f) * f)
        if h * w > self.max_pixels:
            beta = math.sqrt(height * width / self.max_pixels)
            h = max(f, math.floor(height / beta / f) * f)
            w = max(f, math.floor(width / beta / f) * f)
        elif h * w < self.min_pixels:
            beta = math.sqrt(self.min_pixels / (height * width))
            h = math.ceil(height * beta / f) * f
            w = math.ceil(width * beta / f) * f
        return w, h

    def image_tokens(self, width: int, height: int) -> int:
        """Embedding tokens of one image (the prompt adds 2 vision start/end markers)."""
        if self.tokens_per_image is not None:
            return self.tokens_per_image
        w, h = self.resized(width, height)
        return (w // self.factor) * (h // self.factor)

    def prompt_tokens(self, width: int, height: int) -> int:
        """Prompt tokens one image adds, markers included."""
        return self.image_tokens(width, height) + (0 if self.tokens_per_image is not None else 2)

    def entry_bytes(self, width: int, height: int, real_width: bool = False) -> int:
        """Cache bytes of one image's embedding; ``real_width`` counts DeepStack's wider tensor."""
        factor = self.deepstack_factor if real_width else 1
        return self.image_tokens(width, height) * self.bytes_per_token * factor

    def patches(self, width: int, height: int) -> int:
        """Vision patches of one image after resizing (one temporal group for a still image)."""
        if self.tokens_per_image is not None:
            raise SpecError("model", f"{self.name!r} has no patch geometry: give `patch_size` "
                            "and `merge_size` (or `model_path`) to size processor-cache entries")
        w, h = self.resized(width, height)
        return (w // self.patch_size) * (h // self.patch_size)

    def processor_bytes(self, width: int, height: int) -> int:
        """Bytes of one image's processed inputs: pixel patches of channels x temporal patch x
        patch x patch values, plus the int64 (t, h, w) grid."""
        per_patch = self.in_channels * self.temporal_patch_size * self.patch_size ** 2
        return self.patches(width, height) * per_patch * self.pixel_dtype_bytes + GRID_BYTES

    def geometry(self) -> dict:
        """The values that decide tokens and entry sizes (for reports and exports)."""
        if self.tokens_per_image is not None:
            return {"tokens_per_image": self.tokens_per_image,
                    "bytes_per_token": self.bytes_per_token}
        return {"patch_size": self.patch_size, "merge_size": self.merge_size,
                "temporal_patch_size": self.temporal_patch_size, "min_pixels": self.min_pixels,
                "max_pixels": self.max_pixels, "hidden_size": self.hidden_size,
                "dtype_bytes": self.dtype_bytes, "deepstack_factor": self.deepstack_factor}


@lru_cache(maxsize=1)
def _registry() -> dict:
    text = resources.files("mmdatagen").joinpath("data/models.json").read_text("utf-8")
    return json.loads(text)


def model_names() -> list[str]:
    """Registered model names (aliases not included)."""
    return sorted(_registry()["models"])


def get_model(name: str) -> VisionModel:
    """Look a model up by registry name, alias or Hugging Face id (case-insensitive)."""
    reg = _registry()
    models, aliases = reg["models"], reg["aliases"]
    lowered = {k.lower(): k for k in models}
    lowered.update({k.lower(): v for k, v in aliases.items()})
    lowered.update({v["hf_id"].lower(): k for k, v in models.items()})
    key = lowered.get(name.lower())
    if key is None:
        raise UserError(f"unknown model {name!r}; known: {', '.join(model_names())}")
    entry = models[key]
    return VisionModel(name=key, **reg["families"][entry["family"]], **entry)


def generic_model(tokens_per_image: int, bytes_per_token: int) -> VisionModel:
    """A model with a fixed token count per image and a fixed cache cost per token."""
    if tokens_per_image <= 0 or bytes_per_token <= 0:
        raise SpecError("tokens_per_image", "and `bytes_per_token` must be positive")
    return VisionModel(name="generic", hidden_size=bytes_per_token, dtype_bytes=1,
                       tokens_per_image=tokens_per_image)


DTYPE_BYTES = {"bfloat16": 2, "float16": 2, "half": 2, "float32": 4, "float": 4,
               "float8_e4m3fn": 1, "fp8": 1, "uint8": 1}
GEOMETRY_FIELDS = ("patch_size", "merge_size", "temporal_patch_size", "min_pixels", "max_pixels",
                   "hidden_size", "dtype_bytes")


def _read_json(path: Path) -> dict:
    try:
        data = json.loads(path.read_text("utf-8"))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise UserError(f"cannot read {path}: {exc.__class__.__name__}") from None
    if not isinstance(data, dict):
        raise UserError(f"{path} is not a JSON object")
    return data


def _first(*values):
    return next((v for v in values if v is not None), None)


def _video_limits(folder: Path) -> tuple[int | None, int | None]:
    """The video processor's per-frame pixel limits (``video_preprocessor_config.json`` or
    ``processor_config.json``'s ``video_processor``); (None, None) when it has no config of its
    own (transformers then falls back to the image processor's)."""
    video: dict[str, Any] = {}
    if (folder / "video_preprocessor_config.json").is_file():
        video = _read_json(folder / "video_preprocessor_config.json")
    elif (folder / "processor_config.json").is_file():
        video = _read_json(folder / "processor_config.json").get("video_processor") or {}
    size: dict[str, Any] = video["size"] if isinstance(video.get("size"), dict) else {}
    limits = (_first(video.get("min_pixels"), size.get("shortest_edge")),
              _first(video.get("max_pixels"), size.get("longest_edge")))
    try:
        return tuple(None if v is None else int(v) for v in limits)  # type: ignore[return-value]
    except (TypeError, ValueError):
        raise UserError(f"{folder}: video pixel limits must be integers") from None


def model_from_folder(folder: str | Path) -> VisionModel:
    """Geometry of a local Hugging Face checkpoint: ``config.json`` plus its image processor
    config (``preprocessor_config.json``, or ``processor_config.json``'s ``image_processor``)
    and its video processor's pixel limits when it has its own."""
    folder = Path(folder)
    if not (folder / "config.json").is_file():
        raise UserError(f"{folder} is not a Hugging Face model folder (no config.json)")
    cfg = _read_json(folder / "config.json")
    pre: dict[str, Any] = {}
    if (folder / "preprocessor_config.json").is_file():
        pre = _read_json(folder / "preprocessor_config.json")
    elif (folder / "processor_config.json").is_file():
        pre = _read_json(folder / "processor_config.json").get("image_processor") or {}
    text: dict[str, Any] = cfg.get("text_config") or cfg
    vision: dict[str, Any] = cfg.get("vision_config") or {}
    size: dict[str, Any] = pre["size"] if isinstance(pre.get("size"), dict) else {}
    dtype = _first(text.get("dtype"), text.get("torch_dtype"), cfg.get("dtype"),
                   cfg.get("torch_dtype"), "bfloat16")
    fields = {
        "patch_size": _first(pre.get("patch_size"), vision.get("patch_size")),
        "merge_size": _first(pre.get("merge_size"), vision.get("spatial_merge_size")),
        "temporal_patch_size": _first(pre.get("temporal_patch_size"),
                                      vision.get("temporal_patch_size"), 2),
        "min_pixels": _first(pre.get("min_pixels"), size.get("shortest_edge")),
        "max_pixels": _first(pre.get("max_pixels"), size.get("longest_edge")),
        "hidden_size": _first(text.get("hidden_size"), cfg.get("hidden_size")),
    }
    missing = [k for k, v in fields.items() if v is None]
    if missing:
        raise UserError(f"{folder}: cannot find {', '.join(missing)} in config.json or the "
                        "image processor config; give them as flags")
    try:
        fields = {k: int(v) for k, v in fields.items()}
    except (TypeError, ValueError):
        raise UserError(f"{folder}: geometry values must be integers") from None
    deepstack = 1 + len(vision.get("deepstack_visual_indexes") or ())
    video_min, video_max = _video_limits(folder)
    return VisionModel(name=str(folder.name), family=str(cfg.get("model_type", "local")),
                       dtype_bytes=DTYPE_BYTES.get(str(dtype), 2), deepstack_factor=deepstack,
                       video_min_pixels=video_min, video_max_pixels=video_max, **fields)


def with_geometry(model: VisionModel, **overrides: int | None) -> VisionModel:
    """``model`` with the given geometry values replaced (None leaves a value as it is)."""
    changes = {k: v for k, v in overrides.items() if v is not None}
    unknown = set(changes) - set(GEOMETRY_FIELDS)
    if unknown:
        raise UserError(f"unknown geometry field(s): {', '.join(sorted(unknown))}")
    for k, v in changes.items():
        if isinstance(v, bool) or not isinstance(v, int) or v <= 0:
            raise UserError(f"geometry value {k} must be a positive integer, got {v!r}")
    return replace(model, **changes) if changes else model  # type: ignore[arg-type]


def resolve_model(name: str | None = None, path: str | Path | None = None,
                  **geometry: int | None) -> VisionModel:
    """The model whose geometry sizes cache entries: a local folder (``path``, or ``name`` when
    it names an existing folder), else a registry name, else the geometry given alone
    (patch size, merge size and hidden size at least); geometry values override either."""
    if path is not None:
        base = model_from_folder(path)
    elif name and Path(name).is_dir():
        base = model_from_folder(name)
    elif name and _known(name):
        base = get_model(name)
    elif (hidden := geometry.get("hidden_size")) and geometry.get("patch_size") \
            and geometry.get("merge_size"):
        base = VisionModel(name=name or "custom", hidden_size=int(hidden), family="custom")
    elif name:
        raise SpecError("model", f"{name!r}: unknown model (not in the registry, not a local "
                        "folder): give `model_path` DIR (config.json + preprocessor_config.json) "
                        "or the geometry (`patch_size`, `merge_size`, `hidden_size`, ...); "
                        f"known: {', '.join(model_names())}")
    else:
        raise SpecError("model", "is missing: give it, `model_path` or the geometry flags")
    return with_geometry(base, **geometry)


def _known(name: str) -> bool:
    try:
        get_model(name)
    except UserError:
        return False
    return True
