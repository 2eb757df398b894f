"""Video and audio items of a plan: per modality, which items each row shows (pure data).

Videos and audios follow the same reuse rules as images (pool draws, sliding windows) from
their own pools and their own random streams, so adding a modality never moves the images.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from .. import rng
from ..errors import SpecError, UserError
from .sizes import parse_sizes

MODALITIES = ("video", "audio")
DEFAULT_VIDEO_SIZE = "640x360"  # a workload's videos where no --video-size is given


@dataclass
class MediaPlan:
    """One modality's part of a plan: ``ids[r]`` lists row r's items (rows in file order).

    ``widths``/``heights`` give each video item's size (None for audio).
    """

    modality: str
    ids: np.ndarray
    num_items: int
    widths: np.ndarray | None = None
    heights: np.ndarray | None = None

    @property
    def per_row(self) -> int:
        return int(self.ids.shape[1])

    def reordered(self, perm: np.ndarray) -> MediaPlan:
        return MediaPlan(self.modality, self.ids[perm], self.num_items, self.widths, self.heights)


def check_counts(**counts: int) -> None:
    """Every per-request count (by flag name) zero or positive, and at least one in all."""
    for name, value in counts.items():
        if value is None or value < 0:
            raise SpecError(name, f"must be zero or positive, got {value}")
    if sum(counts.values()) == 0:
        first, *rest = counts
        raise SpecError(first, f"and {', '.join(rest)} add up to 0: a request needs at least "
                        "one image, video or audio")


def video_media(ids: np.ndarray, num_items: int, video_size: str | list, seed: int) -> MediaPlan:
    """A video MediaPlan: one size for all items, or seeded weighted draws per item."""
    sizes = parse_sizes(video_size)
    for w, h, _ in sizes:
        if w % 2 or h % 2 or w < 16 or h < 16:
            raise UserError(f"video size {w}x{h}: sides must be even and at least 16")
    if len(sizes) == 1:
        widths = np.full(num_items, sizes[0][0], np.int32)
        heights = np.full(num_items, sizes[0][1], np.int32)
    else:
        weights = np.array([s[2] for s in sizes], float)
        pick = rng.rng_for(seed, rng.VIDEO_SIZE).choice(len(sizes), size=num_items,
                                                         p=weights / weights.sum())
        table = np.array([(s[0], s[1]) for s in sizes], np.int32)
        widths, heights = table[pick, 0].copy(), table[pick, 1].copy()
    return MediaPlan("video", ids, num_items, widths, heights)
