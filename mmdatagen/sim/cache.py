"""The simulator's cache is the shared cache model (``mmdatagen.caches``): one implementation of
cache semantics for the simulator and the loader's prediction."""
from __future__ import annotations

from ..caches.model import OrderedCache


class EmbeddingCache(OrderedCache):
    """A byte LRU that inserts on lookup and skips entries larger than its capacity (Dynamo's
    aggregated embedding cache), with the explicit ``insert`` the older tests drive."""

    def __init__(self, capacity_bytes: int) -> None:
        super().__init__(capacity_bytes)

    def lookup(self, key, items=None):
        """``lookup(key)`` counts one query and refreshes a hit (inserts nothing)."""
        if items is not None:
            return super().lookup(key, items)
        hit = self._count(key in self._data)
        if hit:
            self._data.move_to_end(key)
        return hit
