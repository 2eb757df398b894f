"""Test oracles: LRU replays with an OrderedDict, one capacity per pass, obviously correct, slow.

Only tests use them (the library's one cache model is ``mmdatagen.caches.model``); they check
the one-pass curves, ``lru_hits`` and the compiled insert-at-completion replay.
"""
from __future__ import annotations

from collections import OrderedDict
from collections.abc import Sequence

import numpy as np


def insert(cache: OrderedDict, used: int, key, size: int, capacity: float, oversize: str) -> int:
    """Store a missed ``key`` at the MRU end, evicting from the LRU end; returns bytes used."""
    if size > capacity:
        if oversize == "flush":
            cache.clear()
            return 0
        return used
    cache[key] = size
    used += size
    while used > capacity:
        used -= cache.popitem(last=False)[1]
    return used


def replay_lru(keys: Sequence, sizes: Sequence[int], capacity: float,
               oversize: str = "bypass") -> list[bool]:
    """Hit (True) or miss per reference in a byte LRU of ``capacity`` with whole-object eviction.

    An entry keeps the size of the reference that inserted it. ``oversize``: an entry larger than
    the capacity is skipped ("bypass") or evicts everything and is then not stored ("flush").
    """
    cache: OrderedDict = OrderedDict()
    used = 0
    out = []
    for key, size in zip(keys, sizes):
        if key in cache:
            cache.move_to_end(key)
            out.append(True)
            continue
        out.append(False)
        used = insert(cache, used, key, size, capacity, oversize)
    return out


def completion_hits(ev: np.ndarray, row_refs: list[np.ndarray], obj_sizes: np.ndarray,
                    capacity: float, oversize: str = "bypass") -> list[np.ndarray]:
    """Per row, hit flags of its references when entries are inserted only at completion.

    A lookup at dispatch hits if the entry is present (and refreshes it); a missed entry is stored
    when its request completes (unless another request stored it meanwhile: then refreshed).
    """
    sizes = obj_sizes.tolist()
    cache: OrderedDict[int, int] = OrderedDict()
    used = 0
    pending: dict[int, list[int]] = {}
    hits: list[np.ndarray] = [np.zeros(0, bool)] * len(row_refs)
    for e in ev.tolist():
        if e >= 0:
            refs = row_refs[e].tolist()
            flags = []
            for x in refs:
                if x in cache:
                    cache.move_to_end(x)
                    flags.append(True)
                else:
                    flags.append(False)
            hits[e] = np.array(flags, bool)
            pending[e] = [x for x, f in zip(refs, flags) if not f]
            continue
        for x in pending.pop(~e):
            if x in cache:
                cache.move_to_end(x)
                continue
            used = insert(cache, used, x, sizes[x], capacity, oversize)
    return hits


def replay_two_tier(rows: Sequence[Sequence], tokens: dict, entry_bytes: dict, budget: int,
                    capacity: int) -> dict:
    """Dynamo's connector behind vLLM's encoder cache, one request at a time (each request's
    prompt computed before the next is scheduled), written from the engines' descriptions:

    - encoder cache: an item already held (in use, or released and not yet evicted) is served
      there and the connector is not asked; else, when the free room plus the released items
      can hold it, room is made by evicting released items oldest release first (otherwise it
      is encoded and not kept); the request's items are released once it is done, in input
      order, a repeated item at its last occurrence;
    - connector (asked on an encoder-cache miss): a byte LRU; present = a hit, refreshed; absent
      = a miss, saved (least recent evicted until it fits; larger than the capacity: not saved).
    Returns the encoder-cache hits and the connector's hits, misses and evictions, and the
    connector's hits per row (``per_row``)."""
    held: OrderedDict = OrderedDict()  # encoder cache: key -> tokens, release order
    lru: OrderedDict = OrderedDict()
    used = 0
    out: dict = {"encoder_hits": 0, "hits": 0, "misses": 0, "evictions": 0, "per_row": []}
    for row in rows:
        in_use: list = []
        out["per_row"].append(out["hits"])
        for key in row:
            if key in held:
                out["encoder_hits"] += 1
                if key not in in_use:
                    in_use.append(key)
                continue
            free = budget - sum(held.values())
            releasable = [k for k in held if k not in in_use]
            if free + sum(held[k] for k in releasable) >= tokens[key]:
                while free < tokens[key]:
                    free += held.pop(releasable.pop(0))
                held[key] = tokens[key]
                in_use.append(key)
            if key in lru:
                out["hits"] += 1
                lru.move_to_end(key)
                continue
            out["misses"] += 1
            size = entry_bytes[key]
            if size > capacity:
                continue
            while used + size > capacity:
                used -= lru.popitem(last=False)[1]
                out["evictions"] += 1
            lru[key] = size
            used += size
        out["per_row"][-1] = out["hits"] - out["per_row"][-1]
        last = {key: i for i, key in enumerate(row)}
        for key in sorted(in_use, key=last.__getitem__):  # released in input order, a repeated
            held.move_to_end(key)                        # item at its last occurrence
    return out
