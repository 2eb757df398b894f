"""A byte-capacity LRU for image embeddings, with the counters the simulator exports."""
from __future__ import annotations

from collections import OrderedDict


class EmbeddingCache:
    """LRU by bytes. Capacity 0 disables it (every lookup misses, nothing is stored).

    An entry larger than the capacity is skipped and nothing is evicted (Dynamo's rule).
    """

    def __init__(self, capacity_bytes: int) -> None:
        self.capacity = max(0, int(capacity_bytes))
        self._data: OrderedDict[str, int] = OrderedDict()
        self.bytes = 0
        self.queries = self.hits = self.misses = self.evictions = self.inserts = 0

    def __len__(self) -> int:
        return len(self._data)

    def __contains__(self, key: str) -> bool:
        return key in self._data

    def lookup(self, key: str) -> bool:
        """Count a query; on a hit, refresh recency."""
        self.queries += 1
        if key in self._data:
            self._data.move_to_end(key)
            self.hits += 1
            return True
        self.misses += 1
        return False

    def insert(self, key: str, size: int) -> None:
        """Store (or refresh) an entry, evicting least-recently-used entries to fit."""
        if key in self._data:
            self._data.move_to_end(key)
            return
        if self.capacity == 0 or size > self.capacity:
            return
        self.inserts += 1
        while self.bytes + size > self.capacity:
            _, old = self._data.popitem(last=False)
            self.bytes -= old
            self.evictions += 1
        self._data[key] = size
        self.bytes += size

    def keys(self) -> list[str]:
        """Keys from least to most recently used."""
        return list(self._data)

    def counters(self) -> dict[str, int]:
        return {"queries": self.queries, "hits": self.hits, "misses": self.misses,
                "evictions": self.evictions, "bytes": self.bytes, "entries": len(self._data)}
