"""The order band of vLLM's encoder cache (alone, or in front of Dynamo's tier) under a
first-come-first-served scheduler with chunked prefill: item by item, as the engine goes.

vLLM's scheduler spends each step's token budget on the running requests first, then on the
waiting ones in arrival order, so the prompts are consumed as one stream in arrival order, cut
into steps. It looks an item up when a step's chunk first reaches it and frees it at the end of
the step whose chunk passes it (``Scheduler._free_encoder_inputs``). A request's first token
comes at the end of the step that ends its prompt, so the client's first-token groups (one per
step, ``band.fcfs_windows``) are consecutive runs of the stream, in the groups' order, each run
in an order the client does not know. Only the first request of a run can span steps: a step
that stops inside a prompt has spent its budget, so the previous group's step ends inside (or
at the start of) it, and so does any step that ends no prompt.

So a group's events are: its first request's items looked up in order with one or more cuts
among them (the first frees the previous group's items, each frees what the stream has passed:
the first request's own items before it, or all but the one it cuts through), then the other
members' items in order, which stay pinned until the next group's first cut. The search walks
the groups, branching on the first member, the others' order and the cuts, over the age
search's states (``band._Tiers``: pinned items exact, freeable and connector entries by
intervals of ages), one per pinned structure and ages, with the lowest and highest hits that
reach it; past ``KEEP`` states per structure after a group they are joined (a bound from then
on). The band holds the engine's order when its assumptions hold:

- the groups are the engine's steps (first tokens within a step arrive together, steps apart);
- no request waits for encoder-cache room or encoder budget while a later one goes ahead
  (vLLM lets a running request that cannot get room yield its turn): the budget covers the
  items a step can start (``max_num_batched_tokens`` plus the largest item, or more);
- every request was scheduled (it has a first token).

Each item is a request of its own in the cache model (``(position, index)``), so freeing one
leaves the request's others pinned.

A group in no known order with over ``MAX_ORDERS`` sequences to walk (each first member with each
arrangement of its cuts, then each order of the others) is searched by sets instead, up to
``MAX_SET_MEMBERS`` requests: after its first member, states are kept per set of members done
(equal states of one set reached in different orders are one), and its pinned items are held
as one unordered batch (``BATCH``), which the next group's first cut releases in any order:
each freed item's age then spans every place in that release. A bound from then on."""
from __future__ import annotations

import itertools
import math
from collections.abc import Hashable, Iterator, Sequence
from typing import Any

import numpy as np

from .band import TIER_STATES, _tier_trim, _TierModel, _Tiers, _widen

Item = tuple[Hashable, int]
CHUNKED_BUDGET = 16_000_000  # work units (5-20 s here) before the search gives up
MAX_ORDERS = 300  # a group with more (first member and cuts, then the others' order) goes by sets
MAX_SET_MEMBERS = 8  # a larger group in no known order (its sets: 2 ** members): it gives up
SET_KEEP = 2  # states per set of members done and pinned structure before they are joined
SET_COST = 2  # work units per outcome and entry searched by sets (each keyed, then joined)
KEEP = TIER_STATES  # states per pinned structure after a group before they are joined
# a cut: free every pinned item but the first member's own from this index on
Script = tuple[tuple[str, int], ...]
# pinned structure -> ages -> (state, lowest per weight..., highest per weight...)
Layer = dict[Hashable, dict[Hashable, tuple[_Tiers, tuple[float, ...]]]]
PASSED = "passed"  # the name of a pinned item between groups (freed at the next group's first cut)
BATCH = "batch"  # the same, for the items of a group searched by sets: released in any order


def _scripts(m: int, must_cut: bool) -> list[Script]:
    """The first member's lookups (``("L", k)``) and cuts (``("C", r)``: its items before
    ``r`` are freed with every earlier one) in every distinct arrangement: a cut before the
    first lookup, and after each lookup none, one inside the item (``r = k``) or one past it
    (``r = k + 1``); a cut that frees nothing new is left out. ``must_cut``: at least one (the
    previous group's step ends inside this prompt)."""
    out = []
    options = [(None, 0)] + [(None, k, k + 1) for k in range(m)]
    for picks in itertools.product(*options):
        script: list[tuple[str, int]] = []
        last = None
        for k, r in enumerate(picks):
            if k:  # the gap after lookup k - 1
                script.append(("L", k - 1))
            if r is None or (last is not None and r <= last):
                continue
            script.append(("C", r))
            last = r
        if must_cut and last is None:
            continue
        out.append(tuple(script))
    return list(dict.fromkeys(out))


def steps(group: np.ndarray) -> list[list[int]]:
    """The positions of each step: runs of equal first-token group (``group``, ascending:
    ``band.fcfs_windows``' ``lo`` in the groups' order)."""
    return [g.tolist() for g in np.split(np.arange(group.size), np.flatnonzero(np.diff(group)) + 1)]


def first_come_band(groups: Sequence[Sequence[int]], items: Sequence[Sequence[Item]],
                    gain: np.ndarray, cache: Any, budget: int = CHUNKED_BUDGET,
                    ordered: bool = False) -> tuple[list[tuple[int, int]], str] | None:
    """The band bench reports for a target that frees item by item: ``chunked_band`` (its
    arguments), and its method. Past its budget with groups in no known order, every group
    again by sets (a looser bound; half the budget again): on the Dynamo stack at concurrency
    8 the search by orders ran out on 5 of 11 runs of 32 requests (its states multiply across
    groups of 2 to 4), where the one by sets needed 2.4 to 4.7 million units. None when that
    gives up too."""
    got = chunked_band(groups, items, gain, cache, budget, ordered)
    if got is not None:
        return got[0], "chunked search" if got[1] else "chunked bound"
    if ordered:
        return None
    got = chunked_band(groups, items, gain, cache, budget // 2, by_orders=0)
    return None if got is None else (got[0], "chunked bound by sets")


def chunked_band(groups: Sequence[Sequence[int]], items: Sequence[Sequence[Item]],
                 gain: np.ndarray, cache: Any, budget: int = CHUNKED_BUDGET,
                 ordered: bool = False, spent: list[int] | None = None, keep: int = KEEP,
                 by_orders: int = MAX_ORDERS) -> tuple[list[tuple[int, int]], bool] | None:
    """Lowest and highest hits (``gain[w, p]``: a hit of request ``p``'s worth under weight
    vector ``w``) over the engine's orders above, and whether the band is exact; ``groups``:
    the requests (positions) of each step, in step order (``ordered``: each in arrival order,
    as a server log gives it); ``cache``: the target's empty cache (its capacities). None past
    ``budget`` units of work (the work done goes into ``spent``), or at once for a group of
    over ``MAX_SET_MEMBERS`` requests in no known order. A group in no known order with over
    ``by_orders`` sequences (``_sequences``) is searched by sets (``_group_sets``; a bound).

    States are the age search's (``band._Tiers``: pinned items exact, freeable and connector
    entries by intervals of ages), one per pinned structure and ages; past ``keep`` per
    structure after a group they are joined (a bound from then on: certain hits for the
    lowest, possible ones for the highest). A cut frees items in stream order: the previous
    group's pinned ones under one name (``PASSED``) in the order they were looked up, then the
    first member's."""
    if not ordered and any(len(members) > MAX_SET_MEMBERS for members in groups):
        return None
    model, half = _TierModel(cache), gain.shape[0]
    last = {key: g for g, members in enumerate(groups) for p in members for key, _ in items[p]}
    start = _Tiers({}, {}, {}, {})
    layer: Layer = {start.structure(): {start.ages(): (start, (0.0,) * (2 * half))}}
    work, joined = [0], False
    try:
        for g, members in enumerate(groups):
            nxt: Layer = {}
            sets = not ordered and _sequences(members, items) > by_orders
            for st, val in _states(layer):
                if not (_group_sets(model, st, val, g, members, items, gain, last, nxt, work,
                                    budget, keep) if sets else
                        _group(model, st, val, g, members, items, gain, last, ordered, nxt,
                               work, budget)):
                    return None
            joined |= _tier_trim({(0, frozenset()): nxt}, keep) or sets
            layer = nxt
    finally:
        if spent is not None:
            spent.append(work[0])
    vals = [v for _, v in _states(layer)]
    return [(round(min(v[w] for v in vals)), round(max(v[half + w] for v in vals)))
            for w in range(half)], not joined


def _group(model: _TierModel, st: _Tiers, val: tuple[float, ...], g: int,
           members: Sequence[int], items: Sequence[Sequence[Item]], gain: np.ndarray,
           last: dict[Hashable, int], ordered: bool, into: Layer, work: list[int],
           budget: int) -> bool:
    """Group ``g`` from state ``st`` (hits so far ``val``): every first member, cuts and
    order of the others, each outcome merged ``into`` the next layer; False past ``budget``
    (``work[0]``: the work so far)."""
    half = gain.shape[0]
    cost = 1 + len(st.free) + len(st.back)
    for head, firsts in _heads(model, st, g, members[:1] if ordered else members, items,
                               work, cost):
        rest = [p for p in members if p != head]
        for order in [rest] if ordered else itertools.permutations(rest):
            outs = firsts
            for p in order:
                outs = _request(model, outs, p, items, work, cost)
            for n, lo, hi in outs:
                _merge(into, _settled(n, last, g + 1), val, lo, hi, gain, half)
            if work[0] > budget:
                return False
    return True


def _heads(model: _TierModel, st: _Tiers, g: int, heads: Sequence[int],
           items: Sequence[Sequence[Item]], work: list[int], cost: int) -> Iterator[tuple]:
    """Each of ``heads`` as group ``g``'s first member with each arrangement of its cuts, from
    ``st``: (head, its outcomes)."""
    for head in heads:
        for script in _scripts(len(items[head]), must_cut=g > 0):
            firsts = _head_part(model, st, head, script, items)
            work[0] += len(firsts) * cost
            yield head, firsts


def _request(model: _TierModel, outs: list, p: int, items: Sequence[Sequence[Item]],
             work: list[int], cost: int) -> list:
    """Request ``p``'s items looked up in order after each outcome."""
    for k in range(len(items[p])):
        outs = _look(model, outs, p, k, items)
        work[0] += len(outs) * cost
    return outs


def _states(layer: Layer) -> Iterator[tuple[_Tiers, tuple[float, ...]]]:
    """Every (state, hits) of ``layer``."""
    for states in layer.values():
        yield from states.values()


def _sequences(members: Sequence[int], items: Sequence[Sequence[Item]]) -> int:
    """The sequences ``_group`` walks for a group in no known order past the first: each first
    member with each arrangement of its cuts, then each order of the others."""
    others = math.factorial(len(members) - 1)
    return sum(len(_scripts(len(items[p]), must_cut=True)) for p in members) * others


def _group_sets(model: _TierModel, st: _Tiers, val: tuple[float, ...], g: int,
                members: Sequence[int], items: Sequence[Sequence[Item]], gain: np.ndarray,
                last: dict[Hashable, int], into: Layer, work: list[int], budget: int,
                keep: int) -> bool:
    """Group ``g`` as ``_group`` searches it, by sets: after the first member (each, with its
    cuts), the states of each set of members done, those of one pinned structure joined past
    ``keep`` (the order of its lookups is forgotten: the group's pinned items go on as
    ``BATCH``); False past ``budget``."""
    half = gain.shape[0]
    cost = SET_COST * (1 + len(st.pinned) + len(st.free) + len(st.back))
    level: dict[frozenset, Layer] = {}
    for head, firsts in _heads(model, st, g, members, items, work, cost):
        for n, lo, hi in firsts:
            _merge(level.setdefault(frozenset([head]), {}), n, val, lo, hi, gain, half)
    for _ in range(len(members) - 1):
        _tier_trim(level, min(keep, SET_KEEP))  # type: ignore[arg-type]
        nxt: dict[frozenset, Layer] = {}
        for done, structures in level.items():
            for cur, v in _states(structures):
                for p in members:
                    if p in done:
                        continue
                    for n, lo, hi in _request(model, [(cur, {}, {})], p, items, work, cost):
                        _merge(nxt.setdefault(done | {p}, {}), n, v, lo, hi, gain, half)
            if work[0] > budget:
                return False
        level = nxt
    for structures in level.values():
        for n, v in _states(structures):
            _merge(into, _settled(n, last, g + 1, batch=True), v, {}, {}, gain, half)
    return True


def _look(model: _TierModel, outs: list, p: int, k: int, items: Sequence[Sequence[Item]]
          ) -> list:
    """Item ``k`` of request ``p`` looked up after each outcome (its own request: ``(p, k)``);
    hits kept per request."""
    nxt = []
    for st, lo, hi in outs:
        for n, must, may in model.lookup(st, (p, k), [items[p][k]]):
            nxt.append((n, {**lo, p: lo.get(p, 0) + must} if must else lo,
                        {**hi, p: hi.get(p, 0) + may} if may else hi))
    return nxt


def _head_part(model: _TierModel, st: _Tiers, head: int, script: Script,
               items: Sequence[Sequence[Item]]) -> list:
    """The group's first member: its lookups and the cuts among them, from ``st``."""
    outs: list = [(st, {}, {})]
    for what, k in script:
        if what == "L":
            outs = _look(model, outs, head, k, items)
        else:
            outs = [(_free(model, n, [rid for rid in n.held if rid == PASSED or rid[0] != head
                                      or rid[1] < k]), lo, hi) for n, lo, hi in outs]
    return outs


def _free(model: _TierModel, st: _Tiers, rids: Sequence[Hashable]) -> _Tiers:
    """The items of ``rids`` freed at one cut, in stream order (``rids`` in it)."""
    for rid in rids:
        st = _release_batch(st) if rid == BATCH else model.release(st, rid)
    return st


def _release_batch(st: _Tiers) -> _Tiers:
    """The ``BATCH`` items released in any order: an item no one else pins becomes freeable
    with an age from its place as the last of them released (its size plus what stays
    pinned) to the first (plus the others released)."""
    n = st.copy()
    gone = []
    for key in n.held.pop(BATCH, ()):
        size, users = n.pinned[key]
        if users - {BATCH}:
            n.pinned[key] = (size, users - {BATCH})
        else:
            del n.pinned[key]
            gone.append((key, size))
    stay = sum(sz for sz, _ in n.pinned.values())
    released = sum(sz for _, sz in gone)
    n.free = {**n.free, **{key: (sz, sz + stay, stay + released) for key, sz in gone}}
    return n


def _settled(st: _Tiers, last: dict[Hashable, int], first: int, batch: bool = False
             ) -> _Tiers:
    """The state as the groups from ``first`` on need it: dead entries dropped, and every
    pinned item held under one name in the order the stream looked them up (the next group's
    first cut frees them all, in that order); ``batch``: in no order (``BATCH``)."""
    order = [key for keys in st.held.values() for key in keys if key in st.pinned]
    name = BATCH if batch else PASSED
    if batch:
        order = sorted(set(order), key=repr)
    n = _Tiers({key: (sz, frozenset([name])) for key, (sz, _) in st.pinned.items()},
               {name: tuple(order)} if order else {},
               {k: v for k, v in st.free.items() if last.get(k, -1) >= first},
               {k: v for k, v in st.back.items() if last.get(k, -1) >= first})
    return n


def _merge(into: dict, st: _Tiers, val: tuple[float, ...], lo: dict[int, float],
           hi: dict[int, float], gain: np.ndarray, half: int) -> None:
    low = list(val[:half])
    high = list(val[half:])
    for p, n in lo.items():
        for w in range(half):
            low[w] += n * float(gain[w, p])
    for p, n in hi.items():
        for w in range(half):
            high[w] += n * float(gain[w, p])
    new = tuple(low) + tuple(high)
    states = into.setdefault(st.structure(), {})
    key = st.ages()
    cur = states.get(key)
    states[key] = (st, new) if cur is None else (cur[0], _widen(cur[1], new))
