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
