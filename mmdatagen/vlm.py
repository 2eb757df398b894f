"""Model registry: image tokens and embedding-cache bytes per image, shared by analysis and simulator.

The registry itself is data (``data/models.json``); this module only applies the resize rule.
"""
from __future__ import annotations

import json
import math
from dataclasses import dataclass
from functools import lru_cache
from importlib import resources

from .errors import UserError

MAX_ASPECT_RATIO = 200


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
        raise UserError("--tokens-per-image and --bytes-per-token must be positive")
    return VisionModel(name="generic", hidden_size=bytes_per_token, dtype_bytes=1,
                       tokens_per_image=tokens_per_image)
