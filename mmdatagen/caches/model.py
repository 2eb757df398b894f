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

A target with a ``front`` tier (Dynamo's aggregated embedding cache behind vLLM's encoder cache)
is a :class:`TieredCache`: the front cache answers first, and only its misses reach the target's
own cache. Its flags and counters are the back cache's (what the engine's counters report); the
items the front served are in ``last_front`` after each lookup.
"""
from __future__ import annotations

from collections import OrderedDict
from collections.abc import Hashable, Sequence

from .targets import CacheTarget

Item = tuple[Hashable, int]
# Where the simulator publishes the order of its cache events per X-Request-ID, so that a loader
# can replay them through the same model and predict its cache exactly.
TIMELINE_PATH = "/mmdatagen/cache_timeline"
# Cache-reset endpoints, as a client tries them before a run: vLLM's (served under its dev mode,
# VLLM_SERVER_DEV_MODE=1) and the simulator's own, which clears every tier
RESET_PATHS = ("/reset_prefix_cache", "/reset_mm_cache", "/reset_encoder_cache",
               "/mmdatagen/reset_cache")


class CacheModel:
    """Counters and the shared interface; subclasses implement one eviction policy."""

    def __init__(self, capacity: int) -> None:
        self.capacity = max(0, int(capacity))
        self.used = 0
        self.queries = self.hits = self.misses = self.evictions = self.inserts = 0

    def lookup(self, rid: Hashable, items: Sequence[Item]) -> list[bool]:
        raise NotImplementedError

    @property
    def last_front(self) -> list[bool]:
        """Per item of the last lookup: served by a front tier before this cache was asked
        (only a :class:`TieredCache` has one; else empty)."""
        return []

    def finish(self, rid: Hashable) -> None:
        """Default: nothing happens after the lookups."""

    def abort(self, rid: Hashable) -> None:
        """The request went away before its later moment: default, nothing is kept for it."""

    def clear(self) -> None:
        """Drop every entry (a server's cache reset); the counters go on."""
        self._clear()
        self.used = 0

    def _clear(self) -> None:
        raise NotImplementedError

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
    empties the cache and then fails to insert ("flush").

    ``stale_fault`` (with ``touch_first``): vLLM 0.32's API server, whose mirror of the cache
    judges a request's items cached before the walk; when inserting an earlier miss evicted an
    item judged cached (only a request whose items exceed the capacity can), reaching it fails
    the request (HTTP 500 "Expected a cached item"): that lookup is a miss, nothing is inserted
    for it, the walk stops there (the items after it are never looked up: ``lookup`` returns
    fewer flags) and ``last_fault`` is its index."""

    def __init__(self, capacity: int, *, lru: bool = True, insert_on_lookup: bool = True,
                 touch_first: bool = False, oversize: str = "bypass",
                 stale_fault: bool = False) -> None:
        super().__init__(capacity)
        self.lru, self.insert_on_lookup, self.touch_first = lru, insert_on_lookup, touch_first
        self.stale_fault = stale_fault and touch_first and lru
        self.last_fault: int | None = None
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

    def entries(self) -> tuple[Item, ...]:
        """The entries (key, size) from the next to be evicted to the last."""
        return tuple(self._data.items())

    def load(self, entries: Sequence[Item]) -> None:
        """Hold exactly ``entries`` (key, size; next to be evicted first), nothing pending: a
        replay that branches (the loader's order band) restores a state with it."""
        self._data = OrderedDict(entries)
        self.used = sum(size for _, size in entries)
        self._pending.clear()

    def lookup(self, rid: Hashable, items: Sequence[Item]) -> list[bool]:
        data = self._data
        judged: list[bool] | None = None
        if self.touch_first and self.lru:
            if self.stale_fault:
                judged = [key in data for key, _ in items]
            for key, _ in items:
                if key in data:
                    data.move_to_end(key)
        self.last_fault = None
        flags = []
        for n, (key, size) in enumerate(items):
            hit = self._count(key in data)
            flags.append(hit)
            if not hit and judged is not None and judged[n]:
                self.last_fault = n  # evicted by this request's own insert: the engine fails
                break
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

    def _clear(self) -> None:
        self._data.clear()
        self._pending.clear()

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

    def entries(self) -> tuple:
        """The state as a value: the freeable entries (key, size) oldest release first, the
        pinned ones (key, size, users) and each request's held keys; ``load`` restores it
        (the order band's search branches on it). Equal states give equal values."""
        pinned = frozenset((k, self._size[k], frozenset(u)) for k, u in self._users.items() if u)
        held = frozenset((rid, tuple(keys)) for rid, keys in self._held.items())
        return tuple(self._freeable.items()), pinned, held

    def load(self, state: tuple) -> None:
        freeable, pinned, held = state
        self._freeable = OrderedDict(freeable)
        self._freeable_total = sum(size for _, size in freeable)
        self._size = dict(freeable)
        self._users = {k: set() for k, _ in freeable}
        for key, size, users in pinned:
            self._size[key] = size
            self._users[key] = set(users)
        self._held = {rid: list(keys) for rid, keys in held}
        self.used = sum(self._size.values())

    def _clear(self) -> None:
        for d in (self._size, self._users, self._freeable, self._held):
            d.clear()
        self._freeable_total = 0


class TieredCache(CacheModel):
    """Dynamo's aggregated embedding cache as deployed: a vLLM EC connector consulted only when
    vLLM's encoder cache (``front``, a :class:`FreeableCache` in embedding tokens) misses.

    - front hit (the embedding is still in the encoder cache, pinned or freeable): the connector
      is neither asked nor touched (its recency is not refreshed);
    - front miss: the connector's byte LRU (``back``) decides: present = load (a hit, moved to
      most recent), absent = encode and save (a miss; saving evicts least recent first; an entry
      larger than the back capacity is not saved). Counted when the scheduler allocates the item.

    Items are ``(key, bytes)``; the front's size of an item is ``bytes // bytes_per_token``
    (the entry is embedding tokens x hidden size x dtype bytes). ``lookup`` returns the
    connector's hit flags (False for a front hit: it was not looked up there), and
    ``last_front`` which items the front served; the counters are the connector's, with the
    front's hits and the encoder runs beside them."""

    def __init__(self, capacity: int, front_tokens: int, bytes_per_token: int) -> None:
        super().__init__(capacity)
        if bytes_per_token <= 0:
            raise ValueError("bytes_per_token must be positive")
        self.front = FreeableCache(front_tokens)
        self.back = OrderedCache(capacity, lru=True, insert_on_lookup=True, oversize="bypass")
        self.bytes_per_token = bytes_per_token
        self._front_flags: list[bool] = []

    def __len__(self) -> int:
        return len(self.back)

    def __contains__(self, key: Hashable) -> bool:
        return key in self.back

    def keys(self) -> list:
        """The connector's keys, least recent first."""
        return self.back.keys()

    @property
    def last_front(self) -> list[bool]:
        return self._front_flags

    def lookup(self, rid: Hashable, items: Sequence[Item]) -> list[bool]:
        bpt = self.bytes_per_token
        front = self.front.lookup(rid, [(key, -(-size // bpt)) for key, size in items])
        self._front_flags = front
        flags = []
        for (key, size), served in zip(items, front):
            if served:
                flags.append(False)
                continue
            flags.append(self._count(key in self.back))
            self.back.insert(key, size)  # a hit is moved to most recent; a miss is saved
        self._sync()
        return flags

    def _sync(self) -> None:
        self.used, self.evictions, self.inserts = self.back.used, self.back.evictions, self.back.inserts

    def finish(self, rid: Hashable) -> None:
        self.front.finish(rid)

    def abort(self, rid: Hashable) -> None:
        self.front.abort(rid)

    def entries(self) -> tuple:
        """The state as a value (the front's, then the connector's entries); see ``load``."""
        return self.front.entries(), self.back.entries()

    def load(self, state: tuple) -> None:
        self.front.load(state[0])
        self.back.load(state[1])
        self._sync()

    def _clear(self) -> None:
        self.front.clear()
        self.back.clear()

    def clear_front(self) -> None:
        """vLLM's encoder-cache reset: the front only (no endpoint of vLLM's resets the
        connector's LRU; a restart does)."""
        self.front.clear()

    def counters(self) -> dict[str, int]:
        out = super().counters()
        out.update(encoder_hits=self.front.hits, encoder_runs=self.misses,
                   encoder_evictions=self.front.evictions)
        return out


def make_cache(target: CacheTarget, capacity: int, *, front_tokens: int | None = None,
               bytes_per_token: int | None = None, engine_faults: bool = False) -> CacheModel:
    """The cache model of ``target`` with ``capacity`` in its entry unit (bytes or tokens). A
    target with a front tier also needs the front's budget in tokens and the model's entry
    bytes per token. ``engine_faults``: the engine's own failures too (the ``stale_fault`` of
    a target whose ``faults`` name one), as a prediction of a real engine needs; the simulator
    and the analysis model the engine without its bugs."""
    if target.front is not None:
        if front_tokens is None or bytes_per_token is None:
            raise ValueError(f"cache {target.name} needs the front tier's budget and the "
                             "model's bytes per token")
        return TieredCache(capacity, front_tokens, bytes_per_token)
    if target.eviction == "freeable":
        return FreeableCache(capacity)
    return OrderedCache(capacity, lru=target.eviction == "lru",
                        insert_on_lookup=target.insert_on_lookup,
                        touch_first=target.touch_request_first, oversize=target.oversize,
                        stale_fault=engine_faults and "vllm-mm-cache-mirror" in target.faults)
