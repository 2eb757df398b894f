"""Predicted embedding-cache hits from the ACTUAL dispatch order (order of request starts).

Each request's image references (its own and, for multi_turn, the history it resends) are keyed
as vLLM keys them (encoded bytes; the uuid when one is given; the URL string for http URLs) and
sized with the model registry. After the run, ``mmdatagen.analysis.lru_hits`` replays them
through a byte LRU of the cache capacity.
"""
from __future__ import annotations

from typing import Any

import blake3
import numpy as np

from ..errors import DatasetError
from ..io.imageref import data_url_dims
from ..io.readers import Turn
from ..vlm import VisionModel

DEFAULT_URL_SIZE = (640, 480)  # http(s) URLs are not fetched; the simulator assumes the same


def _dims_of_data_url(url: str) -> tuple[int, int] | None:
    try:
        return data_url_dims(url.partition(",")[2])
    except DatasetError:
        return None


class ImageTracker:
    """Collects (key, bytes) per image reference as requests start; phase per reference."""

    def __init__(self, model: VisionModel, encoder: Any) -> None:
        self.model = model
        self.encoder = encoder
        self.keys: list[str] = []
        self.sizes: list[int] = []
        self.req_index: list[int] = []
        self.requests = 0
        self._size_of: dict[str, int] = {}
        self.undecodable = 0

    def _key_size(self, url: str, uuid: str | None) -> tuple[str, int]:
        if url.startswith("data:"):
            key = blake3.blake3(url.encode("ascii", "replace")).hexdigest()
        else:
            key = "url:" + url
        if uuid:
            key = "uuid:" + uuid
        size = self._size_of.get(key)
        if size is None:
            dims = _dims_of_data_url(url) if url.startswith("data:") else DEFAULT_URL_SIZE
            if dims is None:
                self.undecodable += 1
                dims = DEFAULT_URL_SIZE
            size = self.model.entry_bytes(*dims)
            self._size_of[key] = size
        return key, size

    def on_start(self, turn: Turn, history: list[dict] | None) -> None:
        """Called just before a request is sent (so in dispatch order)."""
        idx = self.requests
        self.requests += 1
        refs: list[tuple[str, str | None]] = []
        for msg in history or ():
            content = msg.get("content")
            if isinstance(content, list):
                for part in content:
                    if part.get("type") == "image_url":
                        refs.append((part["image_url"]["url"], part.get("uuid")))
        uuids = turn.image_uuids or []
        images = turn.images or [""] * len(uuids)
        for i, ref in enumerate(images):
            refs.append((self.encoder.url(ref) if ref else "", uuids[i] if i < len(uuids) else None))
        for url, uuid in refs:
            key, size = self._key_size(url, uuid)
            self.keys.append(key)
            self.sizes.append(size)
            self.req_index.append(idx)

    def predict(self, capacity_bytes: float, profiling_mask: np.ndarray) -> dict:
        """Hit counts over the profiling requests (warmup references warm the cache)."""
        from ..analysis import lru as lru_mod

        if not self.keys:
            return {"references": 0, "hits": 0, "misses": 0, "hit_rate": None}
        hits = lru_mod.lru_hits(self.keys, self.sizes, capacity_bytes)
        req = np.asarray(self.req_index, np.int64)
        keep = profiling_mask[req] if profiling_mask.size else np.ones(req.size, bool)
        h = int(hits[keep].sum())
        n = int(keep.sum())
        per_req = np.bincount(req[hits], minlength=self.requests)
        return {"references": n, "hits": h, "misses": n - h,
                "hit_rate": h / n if n else None, "per_request_hits": per_req}
