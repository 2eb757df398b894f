"""Requests' cache items as columns: what a prediction replays over a million requests without
a million lists of tuples (``merge-runs``' merged prediction; the order band's bounds).

Request ``p`` holds items ``start[p]:start[p + 1]``; an item is a dense key id and a size (in the
cache's entry unit, as ``caches.model`` takes them). Indexing gives a request's items as the
cache model's ``(key, size)`` tuples, so the columns stand wherever a list of item lists does.
"""
from __future__ import annotations

from collections.abc import Hashable, Iterator, Sequence

import numpy as np


class RequestItems(Sequence):
    """Each request's cache items (``start``: n + 1 offsets; ``key``: dense key id per item;
    ``size``: per item), read as a sequence of ``[(key, size), ...]`` lists."""

    def __init__(self, start: np.ndarray, key: np.ndarray, size: np.ndarray,
                 names: list[Hashable] | None = None) -> None:
        self.start = np.asarray(start, np.int64)
        self.key = np.asarray(key, np.int64)
        self.size = np.asarray(size, np.int64)
        self.names = names  # the key of each id, where the items came as lists (else the id)
        self._made: list | None = None

    @classmethod
    def of(cls, items: Sequence[Sequence[tuple[Hashable, int]]]) -> RequestItems:
        """From item lists (keys any hashables: equal keys get one id)."""
        if isinstance(items, RequestItems):
            return items
        ids: dict[Hashable, int] = {}
        key = np.fromiter((ids.setdefault(k, len(ids)) for it in items for k, _ in it), np.int64)
        size = np.fromiter((s for it in items for _, s in it), np.int64, key.size)
        start = np.zeros(len(items) + 1, np.int64)
        np.cumsum([len(it) for it in items], out=start[1:])
        return cls(start, key, size, list(ids))

    @classmethod
    def concat(cls, parts: Sequence[RequestItems]) -> RequestItems:
        """The parts' requests one after the other (their key ids must already be shared)."""
        if not parts:
            return cls(np.zeros(1, np.int64), np.zeros(0, np.int64), np.zeros(0, np.int64))
        ends = np.cumsum([0] + [p.key.size for p in parts])
        start = np.concatenate([parts[0].start[:1]] + [p.start[1:] - p.start[0] + e
                                                       for p, e in zip(parts, ends)])
        return cls(start, np.concatenate([p.key for p in parts]),
                   np.concatenate([p.size for p in parts]), parts[0].names)

    def __len__(self) -> int:
        return int(self.start.size) - 1

    def __getitem__(self, p):
        if isinstance(p, slice):
            return self.take(np.arange(len(self))[p])
        if not -len(self) <= p < len(self):
            raise IndexError(p)
        p %= len(self)
        if self._made is None:  # made one by one as asked (a search asks a few, many times)
            self._made = [None] * len(self)
        got = self._made[p]
        if got is None:
            a, b = int(self.start[p]), int(self.start[p + 1])
            keys = self.key[a:b].tolist()
            got = self._made[p] = list(zip(keys if self.names is None else
                                           [self.names[k] for k in keys],
                                           self.size[a:b].tolist()))
        return got

    def __iter__(self) -> Iterator[list[tuple[int, int]]]:
        start, key, size = self.start.tolist(), self.key.tolist(), self.size.tolist()
        if self.names is not None:
            key = [self.names[k] for k in key]
        return (list(zip(key[a:b], size[a:b])) for a, b in zip(start, start[1:]))

    @property
    def counts(self) -> np.ndarray:
        """Items per request."""
        return np.diff(self.start)

    @property
    def owner(self) -> np.ndarray:
        """Per item, its request."""
        return np.repeat(np.arange(len(self), dtype=np.int64), self.counts)

    @property
    def num_keys(self) -> int:
        return int(self.key.max()) + 1 if self.key.size else 0

    def name(self, key: int) -> Hashable:
        """The key of id ``key``, as indexing gives it."""
        return key if self.names is None else self.names[key]

    def refs(self, rows: np.ndarray) -> np.ndarray:
        """The item positions of requests ``rows``, request after request, each in its order."""
        rows = np.asarray(rows, np.int64)
        counts = self.counts[rows]
        first = np.repeat(self.start[rows] - np.cumsum(counts) + counts, counts)
        return first + np.arange(int(counts.sum()), dtype=np.int64)

    def take(self, rows: np.ndarray) -> RequestItems:
        """The requests ``rows``, in that order."""
        rows = np.asarray(rows, np.int64)
        at = self.refs(rows)
        start = np.zeros(rows.size + 1, np.int64)
        np.cumsum(self.counts[rows], out=start[1:])
        return RequestItems(start, self.key[at], self.size[at], self.names)

    def apart(self) -> tuple[RequestItems, np.ndarray]:
        """Each item as a request of its own (a request without items stays one, empty), and
        the request each came from."""
        counts = np.maximum(self.counts, 1)
        owner = np.repeat(np.arange(len(self), dtype=np.int64), counts)
        has = np.repeat(self.counts > 0, counts)
        start = np.zeros(owner.size + 1, np.int64)
        np.cumsum(has, out=start[1:])
        return RequestItems(start, self.key, self.size, self.names), owner
