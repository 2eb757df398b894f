"""The workload plan: which image each row shows, sessions and order. Pure data, no pixels."""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import numpy as np

from ..errors import SpecError
from .media import MediaPlan


@dataclass
class Plan:
    """A workload as data.

    ``image_ids[r]`` lists row r's images (ids index ``widths``/``heights``); rows are in file
    order. ``sessions[r]`` is the row's session number (None: every row stands alone) and
    ``turns[r]`` its turn within the session. ``text_keys[r]`` picks the row's text: rows with the
    same key get the same text.
    """

    kind: str
    image_ids: np.ndarray
    widths: np.ndarray
    heights: np.ndarray
    text_keys: np.ndarray
    sessions: np.ndarray | None = None
    turns: np.ndarray | None = None
    session_format: str = "user_{}"
    params: dict[str, Any] = field(default_factory=dict)
    media: dict[str, MediaPlan] = field(default_factory=dict)  # "video"/"audio" -> its items

    @property
    def num_rows(self) -> int:
        return int(self.image_ids.shape[0])

    @property
    def num_images(self) -> int:
        return int(self.widths.shape[0])

    @property
    def images_per_row(self) -> int:
        return int(self.image_ids.shape[1])

    def session_id(self, row: int) -> str | None:
        """The ``session_id`` string written for a row, or None."""
        if self.sessions is None:
            return None
        return self.session_format.format(int(self.sessions[row]))

    def trace(self) -> np.ndarray:
        """Image ids of every reference, in file order (row-major)."""
        return self.image_ids.reshape(-1)

    def session_groups(self) -> list[np.ndarray]:
        """Row indices per session, sessions in order of first appearance, rows in file order."""
        if self.sessions is None:
            return [np.array([r]) for r in range(self.num_rows)]
        _, first = np.unique(self.sessions, return_index=True)
        order = self.sessions[np.sort(first)]
        return [np.flatnonzero(self.sessions == s) for s in order]


def shard_range(total: int, shard_index: int, num_shards: int) -> range:
    """Contiguous item range of one shard; shards in order cover ``range(total)`` exactly."""
    if num_shards < 1:
        raise SpecError("num_shards", "must be at least 1")
    if not 0 <= shard_index < num_shards:
        raise SpecError("shard_index", f"must be in 0..{num_shards - 1}")
    start = total * shard_index // num_shards
    stop = total * (shard_index + 1) // num_shards
    return range(start, stop)


def require_positive(**values: int) -> None:
    """One-line error for any count that is zero or negative."""
    for name, value in values.items():
        if value is None or value <= 0:
            raise SpecError(name, f"must be a positive integer, got {value}")
