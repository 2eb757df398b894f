"""Reference LRU replays with an OrderedDict: one capacity per pass, obviously correct, slow.

Used to check the one-pass curve and as the baseline in ``benchmarks/bench_analysis.py``.
"""
from __future__ import annotations

from collections import OrderedDict
from collections.abc import Sequence


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
