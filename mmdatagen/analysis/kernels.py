"""The one-pass byte-LRU kernel, written once and run either as plain Python or compiled by numba.

For every reference it computes the smallest byte capacity at which that reference hits in an LRU
that evicts whole objects from the LRU end: ``size(x) + sum(size(y) for distinct y referenced
since x's previous reference)``; first references get -1 (they miss at every capacity).

The sum is a Fenwick tree over "slots": every object holds one slot, at its last access, weighted
by its size. Slots are handed out in access order; when they run out, live slots are renumbered
in order (compaction), so the tree stays about twice the number of distinct objects (cache
friendly) whatever the trace length.

The other kernels turn those numbers into a curve (pack, group) and serve the "bypass" tiers
(window). All are plain loops so numba can compile them and Python can run them on small traces.
"""
from __future__ import annotations

import numpy as np


def stack_kernel(ids, sizes, req, last, osize, tree, slot_obj):
    """Fill ``req`` (required capacity per reference, -1 for a first reference).

    ``ids``: dense object ids per reference; ``sizes``: size per reference (an object's size is
    taken from its first reference). Work buffers: ``last`` and ``osize`` per object (``last``
    preset to -1), ``tree`` and ``slot_obj`` of length T + 1 (T >= number of objects + 1, zeros
    and -1). Works on numpy arrays (numba) and on Python lists alike.
    """
    n = len(ids)
    cap = len(tree) - 1
    nxt = 1
    total = 0
    for i in range(n):
        x = ids[i]
        p = last[x]
        if p < 0:
            s = sizes[i]
            osize[x] = s
            total += s
            req[i] = -1
        else:
            s = osize[x]
            pre = 0
            k = p
            while k > 0:
                pre += tree[k]
                k -= k & -k
            req[i] = total - pre + s
            k = p
            while k <= cap:
                tree[k] -= s
                k += k & -k
            slot_obj[p] = -1
        if nxt > cap:
            # compaction: renumber live slots 1..L in order, rebuild the tree in linear time
            live = 0
            for j in range(1, cap + 1):
                o = slot_obj[j]
                if o >= 0:
                    live += 1
                    slot_obj[j] = -1
                    slot_obj[live] = o
                    last[o] = live
            for j in range(1, cap + 1):
                tree[j] = osize[slot_obj[j]] if j <= live else 0
            for j in range(1, cap + 1):
                k = j + (j & -j)
                if k <= cap:
                    tree[k] += tree[j]
            nxt = live + 1
        k = nxt
        while k <= cap:
            tree[k] += s
            k += k & -k
        slot_obj[nxt] = x
        last[x] = nxt
        nxt += 1
    return req


def window_kernel(ids, obj_sizes, max_size, hi, req, stack):
    """Required capacities below ``hi`` only, with objects larger than ``max_size`` bypassed.

    Keeps the top of the LRU stack whose cumulative size stays below ``hi`` (an object deeper
    than that can only get deeper until it is referenced again, so it can never hit below
    ``hi``). References that cannot hit below ``hi`` (or are bypassed, or first) get -1.
    ``stack`` needs room for ``hi / smallest size + 2`` ids. Cheap when that is small.
    """
    depth = 0
    for i in range(len(ids)):
        x = ids[i]
        s = obj_sizes[x]
        if s > max_size:
            req[i] = -1
            continue
        acc = 0
        pos = -1
        for j in range(depth):
            if stack[j] == x:
                pos = j
                break
            acc += obj_sizes[stack[j]]
        if pos >= 0:
            req[i] = acc + s
        else:
            req[i] = -1
            pos = depth
            depth += 1
        for j in range(pos, 0, -1):
            stack[j] = stack[j - 1]
        stack[0] = x
        acc = 0
        for j in range(depth):
            acc += obj_sizes[stack[j]]
            if acc >= hi:
                depth = j
                break
    return req


def decider_kernel(req, ref_row, out):
    """Mark, per request, the reference whose required capacity decides "all images hit".

    Rows are runs of equal ``ref_row``; a row with a first reference (-1) is never fully served.
    """
    n = len(req)
    i = 0
    while i < n:
        j = i
        best = i
        ok = True
        while j < n and ref_row[j] == ref_row[i]:
            if req[j] < 0:
                ok = False
            elif req[j] > req[best]:
                best = j
            out[j] = 0
            j += 1
        if ok:
            out[best] = 1
        i = j
    return out


def pack_kernel(req, ids, dec, hi, bits):
    """``(req << bits + 1) | (id << 1) | decider`` for references with 0 <= req < hi."""
    count = 0
    for i in range(len(req)):
        if 0 <= req[i] < hi:
            count += 1
    out = np.empty(count, np.int64)
    k = 0
    for i in range(len(req)):
        if 0 <= req[i] < hi:
            out[k] = (req[i] << (bits + 1)) | (ids[i] << 1) | dec[i]
            k += 1
    return out


def group_kernel(packed, bits, obj_sizes, obj_tokens, lo):
    """Cumulative (hits, bytes, tokens, full requests) at ``lo`` and at every distinct req > lo."""
    n = len(packed)
    caps = np.empty(n + 1, np.int64)
    cols = np.zeros((4, n + 1), np.int64)
    mask = (1 << bits) - 1
    caps[0] = lo
    k = 0
    h = 0
    b = 0
    t = 0
    f = 0
    for i in range(n):
        v = packed[i]
        r = v >> (bits + 1)
        o = (v >> 1) & mask
        h += 1
        b += obj_sizes[o]
        t += obj_tokens[o]
        f += v & 1
        if i + 1 < n and (packed[i + 1] >> (bits + 1)) == r:
            continue
        if r > lo:
            k += 1
            caps[k] = r
        cols[0, k] = h
        cols[1, k] = b
        cols[2, k] = t
        cols[3, k] = f
    return caps[: k + 1], cols[:, : k + 1]


def _compiled():
    """The numba-compiled kernel (cached on disk), or None when numba is unavailable."""
    try:
        import numba
    except ImportError:  # pragma: no cover - numba is a dependency; keep working without it
        return None
    jit = numba.njit(cache=True, nogil=True)
    return {f.__name__: jit(f) for f in (stack_kernel, window_kernel, decider_kernel, pack_kernel,
                                         group_kernel)}
