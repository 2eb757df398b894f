"""Cache semantics, implemented once: the simulator runs them live and the loader's prediction
replays them over the request timeline, so both apply the very same rules.

Every cache is driven by two events per request:

- ``lookup(rid, items)``: the request's items (key, size) are looked up in request order at the
  target's lookup moment; returns a hit flag per item. Targets whose entries are present from
  the lookup on insert misses right there.
- ``finish(rid)``: the target's later moment for that request: encoder completion or request
  completion (entries become present), or, for vLLM's encoder cache, the release of the
  request's pinned entries to the freeable list.

Sizes are in the unit the capacity is in (bytes or embedding tokens).
"""
from __future__ import annotations

from collections import OrderedDict
from collections.abc import Hashable, Sequence

from .targets import CacheTarget

Item = tuple[Hashable, int]
# Where the simulator publishes the order of its cache events per X-Request-ID, so that a loader
# can replay them through the same model and predict its cache exactly.
TIMELINE_PATH = "/mmdatagen/cache_timeline"


class CacheModel:
    """Counters and the shared interface; subclasses implement one eviction policy."""

    def __init__(self, capacity: int) -> None:
        self.capacity = max(0, int(capacity))
        self.used = 0
        self.queries = self.hits = self.misses = self.evictions = self.inserts = 0

    def lookup(self, rid: Hashable, items: Sequence[Item]) -> list[bool]:
        raise NotImplementedError

    def finish(self, rid: Hashable) -> None:
        """Default: nothing happens after the lookups."""

    def abort(self, rid: Hashable) -> None:
        """The request went away before its later moment: default, nothing is kept for it."""

    def __len__(self) -> int:
        raise NotImplementedError

    @property
    def bytes(self) -> int:
        """What the entries hold, in the capacity's unit (bytes or tokens)."""
        return self.used

    def counters(self) -> dict[str, int]:
        return {"queries": self.queries, "hits": self.hits, "misses": self.misses,
                "evictions": self.evictions, "inserts": self.inserts, "bytes": self.used,
                "entries": len(self)}

    def _count(self, hit: bool) -> bool:
        self.queries += 1
        if hit:
            self.hits += 1
        else:
            self.misses += 1
        return hit


class OrderedCache(CacheModel):
    """LRU (a hit refreshes recency) or FIFO (it does not) by size.

    ``insert_on_lookup`` False: misses become present only at ``finish`` (so a repeat inside
    the request misses too). ``touch_first``: the request's present items are refreshed before
    any of its misses is inserted (vLLM's processor cache), so a request never evicts its own
    cached items. ``oversize``: an entry larger than the capacity is skipped ("bypass") or
    empties the cache and then fails to insert ("flush")."""

    def __init__(self, capacity: int, *, lru: bool = True, insert_on_lookup: bool = True,
                 touch_first: bool = False, oversize: str = "bypass") -> None:
        super().__init__(capacity)
        self.lru, self.insert_on_lookup, self.touch_first = lru, insert_on_lookup, touch_first
        self.flush = oversize == "flush"
        self._data: OrderedDict[Hashable, int] = OrderedDict()
        self._pending: dict[Hashable, list[Item]] = {}

    def __len__(self) -> int:
        return len(self._data)

    def __contains__(self, key: Hashable) -> bool:
        return key in self._data

    def keys(self) -> list:
        """Keys from the next to be evicted to the last."""
        return list(self._data)

    def lookup(self, rid: Hashable, items: Sequence[Item]) -> list[bool]:
        data = self._data
        if self.touch_first and self.lru:
            for key, _ in items:
                if key in data:
                    data.move_to_end(key)
        flags = []
        for key, size in items:
            hit = self._count(key in data)
            flags.append(hit)
            if hit:
                if self.lru:
                    data.move_to_end(key)
            elif self.insert_on_lookup:
                self.insert(key, size)
            else:
                self._pending.setdefault(rid, []).append((key, size))
        return flags

    def finish(self, rid: Hashable) -> None:
        for key, size in self._pending.pop(rid, ()):
            self.insert(key, size)

    def abort(self, rid: Hashable) -> None:
        self._pending.pop(rid, None)  # never encoded or completed: nothing becomes present

    def insert(self, key: Hashable, size: int) -> None:
        """Store (or, for an LRU, refresh) an entry, evicting from the old end to fit."""
        data = self._data
        if key in data:
            if self.lru:
                data.move_to_end(key)
            return
        if size > self.capacity:
            if self.flush:
                self.evictions += len(data)
                data.clear()
                self.used = 0
            return
        if self.capacity == 0:
            return
        while self.used + size > self.capacity:
            _, old = data.popitem(last=False)
            self.used -= old
            self.evictions += 1
        data[key] = size
        self.used += size
        self.inserts += 1


class FreeableCache(CacheModel):
    """vLLM's encoder cache: an entry is pinned by every request using it; a finished user
    releases it to a freeable list (release order), whose oldest entries are evicted only when
    a new entry needs the room. A freeable entry that is looked up again is a hit and is pinned
    again. An entry that cannot get room (everything else pinned) is computed but not kept."""

    def __init__(self, capacity: int) -> None:
        super().__init__(capacity)
        self._size: dict[Hashable, int] = {}
        self._users: dict[Hashable, set[Hashable]] = {}
        self._freeable: OrderedDict[Hashable, int] = OrderedDict()
        self._held: dict[Hashable, list[Hashable]] = {}
        self._freeable_total = 0

    def __len__(self) -> int:
        return len(self._size)

    def __contains__(self, key: Hashable) -> bool:
        return key in self._size

    def keys(self) -> list:
        """Freeable keys, oldest release first (the eviction order)."""
        return list(self._freeable)

    def lookup(self, rid: Hashable, items: Sequence[Item]) -> list[bool]:
        held = self._held.setdefault(rid, [])
        flags = []
        for key, size in items:
            users = self._users.get(key)
            hit = self._count(users is not None)
            flags.append(hit)
            if users is not None:
                if not users:
                    self._freeable_total -= self._freeable.pop(key)
                users.add(rid)
                held.append(key)
            elif self._allocate(key, size):
                self._users[key] = {rid}
                held.append(key)
        return flags

    def _allocate(self, key: Hashable, size: int) -> bool:
        free = self.capacity - self.used
        if size > free + self._freeable_total:
            return False
        while size > self.capacity - self.used:
            old, old_size = self._freeable.popitem(last=False)
            self._freeable_total -= old_size
            del self._size[old], self._users[old]
            self.used -= old_size
            self.evictions += 1
        self._size[key] = size
        self.used += size
        self.inserts += 1
        return True

    def finish(self, rid: Hashable) -> None:
        """Release the request's entries in input order, a repeated item at its last
        occurrence (vLLM frees an item only when no later input of the request holds it)."""
        held = self._held.pop(rid, ())
        for key in reversed(list(dict.fromkeys(reversed(held)))):
            users = self._users.get(key)
            if users is None or rid not in users:
                continue
            users.discard(rid)
            if not users:
                self._freeable[key] = self._size[key]
                self._freeable_total += self._size[key]

    def abort(self, rid: Hashable) -> None:
        self.finish(rid)  # an aborted request releases its entries


def make_cache(target: CacheTarget, capacity: int) -> CacheModel:
    """The cache model of ``target`` with ``capacity`` in its entry unit (bytes or tokens)."""
    if target.eviction == "freeable":
        return FreeableCache(capacity)
    return OrderedCache(capacity, lru=target.eviction == "lru",
                        insert_on_lookup=target.insert_on_lookup,
                        touch_first=target.touch_request_first, oversize=target.oversize)
