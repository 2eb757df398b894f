"""Image sizes: ``WxH`` (W wide, H tall) or a weighted list ``640x480:3,1024x768:1``."""
from __future__ import annotations

import re

import numpy as np

from .. import rng
from ..errors import UserError
from ..media_tokens import MAX_ASPECT_RATIO

MAX_SIDE = 16384
MAX_PIXELS = 64 * 1024 * 1024
_SIZE = re.compile(r"^\s*(\d+)\s*[xX]\s*(\d+)\s*(?::\s*([0-9.]+))?\s*$")


def parse_sizes(spec: str | list) -> list[tuple[int, int, float]]:
    """Parse a size spec into ``[(width, height, weight)]``; absurd sizes are a UserError."""
    items = spec if isinstance(spec, list) else str(spec).split(",")
    out = []
    for item in items:
        m = _SIZE.match(str(item))
        if not m:
            raise UserError(f"bad image size {item!r}; expected WxH or WxH:weight, e.g. 2400x1080")
        w, h = int(m.group(1)), int(m.group(2))
        try:
            weight = float(m.group(3)) if m.group(3) else 1.0
        except ValueError:
            raise UserError(f"bad image size weight in {item!r}") from None
        if not (1 <= w <= MAX_SIDE and 1 <= h <= MAX_SIDE) or w * h > MAX_PIXELS:
            raise UserError(f"image size {w}x{h} is out of range (sides 1..{MAX_SIDE}, "
                            f"at most {MAX_PIXELS} pixels)")
        if max(w, h) / min(w, h) > MAX_ASPECT_RATIO:  # the Qwen-VL processors refuse it in vLLM
            raise UserError(f"size {w}x{h}: the aspect ratio is above {MAX_ASPECT_RATIO}, which "
                            "vLLM's image and video processors refuse")
        if not 0 < weight < float("inf"):
            raise UserError(f"image size weight must be a positive finite number in {item!r}")
        out.append((w, h, weight))
    if not out:
        raise UserError("no image size given")
    return out


def assign_sizes(num_images: int, sizes: list[tuple[int, int, float]], seed: int
                 ) -> tuple[np.ndarray, np.ndarray]:
    """Per-image (widths, heights): one size for all, or seeded weighted draws per image."""
    if len(sizes) == 1:
        w, h, _ = sizes[0]
        return np.full(num_images, w, np.int32), np.full(num_images, h, np.int32)
    weights = np.array([s[2] for s in sizes], float)
    pick = rng.rng_for(seed, rng.SIZE).choice(len(sizes), size=num_images, p=weights / weights.sum())
    table = np.array([(s[0], s[1]) for s in sizes], np.int32)
    return table[pick, 0].copy(), table[pick, 1].copy()
