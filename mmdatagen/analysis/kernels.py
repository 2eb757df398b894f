"""Every compiled loop of the analysis, in one place, and the one wrapper that compiles them.

The kernels are plain loops over numpy arrays (or Python lists), so numba compiles them as they
are and plain Python runs them on small traces, where importing numba and loading its disk
cache costs more than the loop (``PYTHON_MAX_REFS``). Callers pick a version with
:func:`for_size` (or :func:`compiled`); nothing else in the package imports numba. The compiled
kernels release the GIL: :func:`threads` says how many threads work over a trace may use and
:func:`in_threads` runs independent calls on them.

- ``stack_kernel``: for every reference, the smallest byte capacity at which it hits in an LRU
  that evicts whole objects from the LRU end: ``size(x) + sum(size(y) for distinct y
  referenced since x's previous reference)``; first references get -1 (they miss at every
  capacity). The sum is a Fenwick tree over "slots": every object holds one slot, at its last
  access, weighted by its size. Slots are handed out in access order; when they run out, live
  slots are renumbered in order (compaction), so the tree stays about twice the number of
  distinct objects (cache friendly) whatever the trace length.
- ``stack_join_kernel``: the second half of a trace passed alone, joined to the first half's
  pass (the two halves on two threads).
- ``window_kernel``: the same below a bound, with larger objects bypassed (a shallow stack).
- ``pack_kernel``, ``radix_kernel``, ``group_kernel``: required capacities to a curve.
- ``first_kernel``: dense ids of int64 keys in order of first appearance (a hash table).
- ``touch_kernel``: vLLM's processor cache (a request touches its cached items first).
- ``fifo_kernel``: a FIFO by size at one capacity.
- ``random_events_kernel``, ``completion_kernel``: dispatch orders and insert-at-completion.
- ``*_batch_kernel``: FIFO and insert-at-completion replays, many capacities a pass.
- ``bounds_kernel`` (with ``compact_kernel``; ``bounds_join_kernel`` joins two halves),
  ``hits_kernel``, ``decide_kernel``,
  ``miss_count_kernel``: insert-at-completion one request at a time from per-reference bounds
  (``sampled.OneAtATime``); ``small_completion_kernel``: the same at capacities of a few entries.
"""
from __future__ import annotations

import os
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import numpy as np

# Below this many references the plain-Python kernel beats importing numba and loading its cache.
PYTHON_MAX_REFS = 30_000
# Work over fewer references runs on one thread (starting threads would cost more than it saves).
PARALLEL_MIN_REFS = 1_000_000
MAX_THREADS = 8  # threads one analysis uses at most (the cores it may run on, up to this)
_JIT: dict[str, Callable[..., Any]] = {}


def threads(refs: int) -> int:
    """How many threads work over ``refs`` references uses: the cores this process may run on
    (at most ``MAX_THREADS``), one below ``PARALLEL_MIN_REFS``."""
    if refs < PARALLEL_MIN_REFS or MAX_THREADS <= 1:
        return 1
    try:
        cores = len(os.sched_getaffinity(0))
    except AttributeError:  # pragma: no cover - not Linux
        cores = os.cpu_count() or 1
    return max(1, min(cores, MAX_THREADS))


def in_threads(calls: Sequence[Callable[[], Any]], n: int) -> list[Any]:
    """Each of ``calls``, on up to ``n`` threads at once; their results in order."""
    if n <= 1 or len(calls) <= 1:
        return [c() for c in calls]
    with ThreadPoolExecutor(min(n, len(calls))) as pool:
        return list(pool.map(lambda c: c(), calls))


def lines(rows: int, width: int, fill: int) -> np.ndarray:
    """An int64 array of ``rows`` records of ``width`` (a divisor of 8) fields each, filled with
    ``fill``, starting on a 64-byte boundary: a record a kernel reads at random lies in one cache
    line instead of straddling two (the bounds pass runs 15-25 % faster on 10 M references)."""
    n = rows * width
    buf = np.empty(n + 8, np.int64)
    at = (-buf.ctypes.data % 64) // 8
    out = buf[at:at + n]
    out.fill(fill)
    return out


def compiled(fn: Callable[..., Any]) -> Callable[..., Any]:
    """``fn`` compiled by numba (nopython, cached on disk; compiled at its first call), or
    ``fn`` itself where numba is unavailable."""
    if fn.__name__ not in _JIT:
        try:
            import numba
        except ImportError:  # pragma: no cover - numba is a dependency; keep working without it
            _JIT[fn.__name__] = fn
        else:
            _JIT[fn.__name__] = numba.njit(cache=True, nogil=True)(fn)
    return _JIT[fn.__name__]


def for_size(fn: Callable[..., Any], refs: int) -> Callable[..., Any]:
    """The version of ``fn`` for a trace of ``refs`` references: plain Python when short."""
    return fn if refs <= PYTHON_MAX_REFS else compiled(fn)


def stack_kernel(ids, sizes, req, count, last, osize, tree, slot_obj):
    """Fill ``req`` (required capacity per reference, sizes' unit) and ``count`` (in entries:
    1 + distinct objects since the previous reference); -1 for a first reference. ``sizes``
    per reference (an object keeps its first). Buffers: ``last`` (-1), ``osize`` per object,
    ``slot_obj`` (-1) of T + 1 >= objects + 2, ``tree`` (0) of 2 (T + 1): Fenwick trees of
    sizes (2k) and ones (2k + 1) interleaved, one cache line for both. Arrays or lists."""
    cap = len(slot_obj) - 1
    nxt = 1
    total = seen = 0
    for i in range(len(ids)):
        x = ids[i]
        p = last[x]
        if p < 0:
            s = osize[x] = sizes[i]
            total += s
            seen += 1
            req[i] = count[i] = -1
        else:
            s = osize[x]
            pre = pre1 = 0
            k = p
            while k > 0:
                pre += tree[2 * k]
                pre1 += tree[2 * k + 1]
                k -= k & -k
            req[i] = total - pre + s
            count[i] = seen - pre1 + 1
            k = p
            while k <= cap:
                tree[2 * k] -= s
                tree[2 * k + 1] -= 1
                k += k & -k
            slot_obj[p] = -1
        if nxt > cap:  # compaction: live slots renumbered 1..seen in order, trees rebuilt
            live = 0
            for j in range(1, cap + 1):
                o = slot_obj[j]
                if o >= 0:
                    live += 1
                    slot_obj[j] = -1
                    slot_obj[live] = o
                    last[o] = live
            for j in range(1, cap + 1):
                tree[2 * j] = osize[slot_obj[j]] if j <= live else 0
                tree[2 * j + 1] = 1 if j <= live else 0
            for j in range(1, cap + 1):
                k = j + (j & -j)
                if k <= cap:
                    tree[2 * k] += tree[2 * j]
                    tree[2 * k + 1] += tree[2 * j + 1]
            nxt = live + 1
        k = nxt
        while k <= cap:
            tree[2 * k] += s
            tree[2 * k + 1] += 1
            k += k & -k
        slot_obj[nxt] = x
        last[x] = nxt
        nxt += 1
    return req


def stack_join_kernel(ids, sizes, req, count, last, osize, tree):
    """``stack_kernel``'s results over a later part of a trace (``ids``, ``sizes``), passed
    alone (``req``, ``count``: -1 at each first reference within the part), joined to the pass
    over what came before it (``last``, ``osize``, ``tree``: that pass's buffers at its end; an
    object keeps its size across the parts). A first reference within the part to an object
    seen before needs its size, the distinct objects of the part before it, and the objects
    above its last slot in the earlier pass that the part has not used yet (removed from
    ``tree`` as the part uses them)."""
    cap = len(tree) // 2 - 1
    total = seen = new = new1 = 0
    k = cap
    while k > 0:
        total, seen, k = total + tree[2 * k], seen + tree[2 * k + 1], k - (k & -k)
    for i in range(len(ids)):
        if req[i] >= 0:
            continue
        x = ids[i]
        s, p = osize[x], last[x]
        if p < 0:  # new to both parts: its first reference
            new, new1 = new + sizes[i], new1 + 1
            continue
        pre = pre1 = 0
        k = p
        while k > 0:
            pre, pre1, k = pre + tree[2 * k], pre1 + tree[2 * k + 1], k - (k & -k)
        req[i], count[i] = s + new + total - pre, 1 + new1 + seen - pre1
        k = p
        while k <= cap:
            tree[2 * k], tree[2 * k + 1], k = tree[2 * k] - s, tree[2 * k + 1] - 1, k + (k & -k)
        total, seen, new, new1 = total - s, seen - 1, new + s, new1 + 1
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


def pack_kernel(req, ids, ref_row, hi, bits):
    """``(req << bits + 1) | (id << 1) | decider`` for references with 0 <= req < hi, where
    the decider bit marks, per request (runs of equal ``ref_row``; empty: one reference per
    request), the reference whose required capacity decides "all its images hit" (none when
    the request has a first reference, -1: it is never fully served)."""
    n = len(req)
    out = np.empty(n, np.int64)
    k = 0
    i = 0
    rows = len(ref_row) > 0
    while i < n:
        j = i + 1
        while rows and j < n and ref_row[j] == ref_row[i]:
            j += 1
        best = i
        ok = True
        for q in range(i, j):
            if req[q] < 0:
                ok = False
            elif req[q] > req[best]:
                best = q
        for q in range(i, j):
            if 0 <= req[q] < hi:
                out[k] = (req[q] << (bits + 1)) | (ids[q] << 1) | (1 if ok and q == best else 0)
                k += 1
        i = j
    return out[:k]


def radix_kernel(a, shift):
    """``a`` (non-negative) sorted by its bits from ``shift`` up: a least-significant-digit
    radix sort, 11 bits a pass (the order within equal keys is the input's)."""
    n = len(a)
    top = 0
    for i in range(n):
        top = max(top, a[i] >> shift)
    passes = 0
    while top >> (11 * passes):
        passes += 1
    counts = np.zeros((max(passes, 1), 2048), np.int64)
    for i in range(n):
        v = a[i] >> shift
        for p in range(passes):
            counts[p, (v >> (11 * p)) & 2047] += 1
    src, dst = a, np.empty_like(a)
    for p in range(passes):
        tot = 0
        for d in range(2048):
            c = counts[p, d]
            counts[p, d] = tot
            tot += c
        sh = shift + 11 * p
        for i in range(n):
            d = (src[i] >> sh) & 2047
            dst[counts[p, d]] = src[i]
            counts[p, d] += 1
        src, dst = dst, src
    return src


def group_kernel(packed, bits, obj_sizes, obj_tokens, lo, lead):
    """Cumulative (hits, bytes, tokens, full requests) at ``lo`` and at every distinct req > lo,
    after ``lead`` free slots (room for the curve pieces below ``lo``)."""
    n = len(packed)
    caps = np.empty(n + 1 + lead, np.int64)
    cols = np.empty((4, n + 1 + lead), np.int64)  # written up to the last breakpoint only
    mask = (1 << bits) - 1
    caps[lead] = lo
    for c in range(4):
        cols[c, lead] = 0
    k = lead
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


def first_kernel(keys, table, ids, first):
    """Dense ids of ``keys`` in order of first appearance (``ids``), and the index of each id's
    first key (``first``); returns how many. ``table``: -1, its length a power of two above
    ``len(keys)`` (open addressing by a multiplicative hash, linear probing)."""
    mask, n = len(table) - 1, 0
    for i in range(len(keys)):
        key = keys[i]
        h = ((key * 6364136223846793005) >> 29) & mask
        while table[h] >= 0 and keys[first[table[h]]] != key:
            h = (h + 1) & mask
        if table[h] < 0:
            table[h], first[n], n = n, i, n + 1
        ids[i] = table[h]
    return n


def touch_kernel(ids, row_start, req, obj_sizes, last, prev):
    """Required capacity at the request's start for each first occurrence of an object inside
    its request: from the one-pass distance (size + distinct sizes since the previous
    reference, in ``req``, rewritten in place) subtract the objects the request looked up
    before it that were not referenced since that previous reference. ``row_start`` has one
    more entry than there are requests; ``last`` (-1 per object) and ``prev`` are work buffers.
    """
    for r in range(len(row_start) - 1):
        s, e = row_start[r], row_start[r + 1]
        for i in range(s, e):
            prev[i] = last[ids[i]]
            last[ids[i]] = i
        for i in range(s, e):
            p = prev[i]
            if p < 0 or p >= s:
                continue  # a first reference ever, or a repeat inside the request
            for j in range(s, i):
                if prev[j] >= s or ids[j] == ids[i]:
                    continue  # not the first copy of its object in this request
                if prev[j] < p:
                    req[i] -= obj_sizes[ids[j]]
    return req


def next_kernel(ids, nxt, last):
    """``nxt[i]``: the next reference to the same object as reference i (-1: none); ``last``:
    -1 per object."""
    for i in range(len(ids) - 1, -1, -1):
        nxt[i] = last[ids[i]]
        last[ids[i]] = i
    return nxt


def span_kernel(ids, row_start, sizes, seen):
    """The largest total size of one request's distinct objects (``seen``: -1 per object)."""
    top = 0
    for r in range(len(row_start) - 1):
        total = 0
        for i in range(row_start[r], row_start[r + 1]):
            if seen[ids[i]] != r:
                seen[ids[i]] = r
                total += sizes[ids[i]]
        top = max(top, total)
    return top


def fifo_kernel(ids, obj_sizes, capacity, flags, present, ring):
    """Hit flag per reference in a FIFO by size that skips entries larger than ``capacity``."""
    head = 0
    tail = 0
    used = 0
    n_ring = len(ring)
    for i in range(len(ids)):
        x = ids[i]
        if present[x]:
            flags[i] = 1
            continue
        sz = obj_sizes[x]
        if sz > capacity or capacity == 0:
            continue
        while used + sz > capacity:
            old = ring[head % n_ring]
            head += 1
            present[old] = 0
            used -= obj_sizes[old]
        ring[tail % n_ring] = x
        tail += 1
        present[x] = 1
        used += sz
    return flags


def random_events_kernel(n, k, draws, out):
    """File dispatch, ``k`` in flight, the next completion drawn among those in flight."""
    running = np.empty(max(k, 1), np.int64)
    cnt = nxt = pos = d = 0
    while nxt < n or cnt:
        while nxt < n and cnt < k:
            running[cnt] = nxt
            cnt += 1
            out[pos] = nxt
            pos += 1
            nxt += 1
        j = draws[d] % cnt
        d += 1
        out[pos] = ~running[j]
        pos += 1
        running[j] = running[cnt - 1]
        cnt -= 1
    return out


def completion_kernel(ev, row_start, ids, sizes, capacity, flush, hits, prev, nxt, present):
    """Hit flags under insert-at-completion (dense ids, doubly linked LRU list); fills ``hits``
    (zeros on entry). A lookup at dispatch (event ``r``) hits if the entry is present and
    refreshes it; at completion (``~r``) each missed entry is stored, or refreshed when another
    request stored it meanwhile. ``prev``/``nxt`` (-1) and ``present`` (0) have one slot per
    object; ``tail`` is the least recently used, ``head`` the most.
    """
    head = tail = -1
    used = 0
    for e in ev:
        done = e < 0
        r = ~e if done else e
        for i in range(row_start[r], row_start[r + 1]):
            x = ids[i]
            if done and hits[i]:
                continue
            if present[x]:
                if not done:
                    hits[i] = 1
                if x != head:  # unlink, then push to the front
                    nxt[prev[x]] = nxt[x]
                    if nxt[x] >= 0:
                        prev[nxt[x]] = prev[x]
                    else:
                        tail = prev[x]
                    prev[x] = -1
                    nxt[x] = head
                    prev[head] = x
                    head = x
                continue
            if not done:
                continue
            s = sizes[x]
            if s > capacity:
                while flush and head >= 0:  # flush: empty the cache, store nothing
                    y = head
                    head = nxt[y]
                    present[y] = 0
                    prev[y] = nxt[y] = -1
                    tail = -1
                    used = 0
                continue
            present[x] = 1
            prev[x] = -1
            nxt[x] = head
            if head >= 0:
                prev[head] = x
            else:
                tail = x
            head = x
            used += s
            while used > capacity:  # never empties: x alone fits
                y = tail
                tail = prev[y]
                nxt[tail] = -1
                present[y] = 0
                prev[y] = -1
                used -= sizes[y]
    return hits


def front_kernel(ev, row_start, ids, tok, budget, served, held, users, owner, present, prv, nxt,
                 out):
    """vLLM's encoder cache (``caches.model.FreeableCache``) over dispatch/completion events
    (none: each row looked up, then completed): ``served[i]`` = 1 where reference i is held
    there (``tiers.front_flags``). ``prv``/``nxt``: the freeable list, circular, doubly linked
    (sentinel M), oldest first. ``out``: hits, evictions, inserts, tokens used and freeable."""
    s_, used, freeable = len(tok), out[3], out[4]
    for q in range(len(ev) or 2 * (len(row_start) - 1)):
        e = ev[q] if len(ev) else (q >> 1) ^ -(q & 1)  # q odd: ~(q // 2)
        r = max(e, ~e)
        a = row_start[r]
        b = row_start[r + 1]
        if e < 0:
            for i in range(b - 1, a - 1, -1):  # mark each item's last held occurrence (2)
                if held[i] == 1 and owner[ids[i]] != ~r:
                    owner[ids[i]] = ~r
                    held[i] = 2
            for i in range(a, b):
                x = ids[i]
                if held[i] == 2:
                    users[x] -= 1
                    if users[x] == 0:  # to the freeable list's newest end
                        p = prv[s_]
                        nxt[p] = x
                        prv[x] = p
                        nxt[x] = s_
                        prv[s_] = x
                        freeable += tok[x]
            continue
        for i in range(a, b):
            x = ids[i]
            t = tok[x]
            if present[x] == 0:
                if t > budget - used + freeable:
                    continue  # no room even after evicting every freeable item: not kept
                while t > budget - used:  # evict the oldest freeable item
                    y = nxt[s_]
                    nxt[s_] = nxt[y]
                    prv[nxt[y]] = s_
                    present[y] = 0
                    used -= tok[y]
                    freeable -= tok[y]
                    out[1] += 1
                present[x] = 1
                used += t
                out[2] += 1
            else:
                served[i] = 1
                out[0] += 1
                if users[x] == 0:  # freeable: pinned again, off the list
                    nxt[prv[x]] = nxt[x]
                    prv[nxt[x]] = prv[x]
                    freeable -= t
            if owner[x] != r:
                owner[x] = r
                users[x] += 1
            held[i] = 1
    out[3] = used
    out[4] = freeable
    return out


def fifo_batch_kernel(ids, ref_row, w, info, caps, stop, pres, ring, ring_at, out):
    """``fifo_kernel`` at each capacity k of ``caps`` (at most 62) in one pass. ``pres`` per
    object: bit k set where present at capacity k; ``ring[ring_at[k]:ring_at[k + 1]]``:
    capacity k's entries in insertion order (room for as many as fit). Misses counted in
    ``out`` (K rows: misses, their bytes and tokens, requests with a miss, then misses, bytes,
    tokens per modality; ``info[4x:4x + 3]``: x's bytes, tokens, modality); capacity k stops
    counting past ``stop[k]`` misses (-1: never), its row then only says "more"."""
    nk = len(caps)
    width = len(out) // nk
    head = np.zeros(nk, np.int64)
    tail = np.zeros(nk, np.int64)
    used = np.zeros(nk, np.int64)
    last = np.full(nk, -1, np.int64)
    active = (1 << nk) - 1
    for i in range(len(ids) * (nk > 0)):
        x, r = ids[i], ref_row[i]
        todo = active & ~pres[x]
        if not todo:
            continue
        s, bx, tx, mx = w[x], info[4 * x], info[4 * x + 1], 4 + 3 * info[4 * x + 2]
        for k in range(nk):
            if not (todo >> k) & 1:
                continue
            o = k * width
            for _ in range(1 + (width > 4)):  # all, then the object's modality
                out[o] += 1
                out[o + 1] += bx
                out[o + 2] += tx
                o = k * width + mx
            if last[k] != r:
                last[k] = r
                out[k * width + 3] += 1
            if out[k * width] > stop[k] >= 0:
                active &= ~(1 << k)
            if s > caps[k] or caps[k] == 0:
                continue
            span = ring_at[k + 1] - ring_at[k]
            while used[k] + s > caps[k]:
                y = ring[ring_at[k] + head[k]]
                head[k] = (head[k] + 1) * (head[k] + 1 < span)  # wraps around, no division
                pres[y] &= ~(1 << k)
                used[k] -= w[y]
            ring[ring_at[k] + tail[k]] = x
            tail[k] = (tail[k] + 1) * (tail[k] + 1 < span)
            pres[x] |= 1 << k
            used[k] += s
    return out


def completion_batch_kernel(ev, row_start, ids, w, info, caps, stop, flush, pres, stamp, miss,
                            log, out):
    """``completion_kernel`` at each capacity k of ``caps`` (at most 62) in one pass; ``pres``,
    ``out`` and ``stop`` as in ``fifo_batch_kernel``. An LRU by access stamps: the t-th
    reference the events visit has stamp t (``log[t]``: its object); ``stamp[x * K + k]``: x's
    last at capacity k, so scanning the log from a tail finds the least recently used entry.
    ``miss[i]``: bit k set where reference i missed at capacity k (stored at completion)."""
    nk = len(caps)
    width = len(out) // nk
    used = np.zeros(nk, np.int64)
    tail = np.zeros(nk, np.int64)
    last = np.full(nk, -1, np.int64)
    active = (1 << nk) - 1
    t = 0
    for q in range(len(ev)):
        look = ev[q] >= 0
        r = max(ev[q], ~ev[q])
        for i in range(row_start[r], row_start[r + 1]):
            x = log[t] = ids[i]
            if look:
                miss[i] = active & ~pres[x]
            for k in range(nk * max(look, miss[i] != 0)):
                if (pres[x] >> k) & 1:
                    if look or (miss[i] >> k) & 1:
                        stamp[x * nk + k] = t  # a hit at lookup, or stored meanwhile
                elif look:
                    o = k * width
                    for _ in range(1 + (width > 4)):  # all, then the modality
                        out[o] += 1
                        out[o + 1] += info[4 * x]
                        out[o + 2] += info[4 * x + 1]
                        o = k * width + 4 + 3 * info[4 * x + 2]
                    if last[k] != r:
                        last[k] = r
                        out[k * width + 3] += 1
                    if out[k * width] > stop[k] >= 0:
                        active &= ~(1 << k)
                elif (miss[i] >> k) & 1 and (w[x] <= caps[k] or flush):
                    lim = caps[k] * (w[x] <= caps[k])  # too large: the cache is flushed
                    if lim:
                        pres[x] |= 1 << k
                        stamp[x * nk + k] = t
                        used[k] += w[x]
                    while used[k] > lim:
                        y = log[tail[k]]
                        if (pres[y] >> k) & 1 and stamp[y * nk + k] == tail[k]:
                            pres[y] &= ~(1 << k)
                            used[k] -= w[y]
                        tail[k] += 1
            t += 1
    return out


def completion1_batch_kernel(row_start, ids, w, info, caps, stop, flush, pres, cmask, stamps,
                             miss, log, sup, alive, out):
    """``completion_batch_kernel``, one request at a time: present entries carry the object's
    last lookup stamp (``stamps[2x]``, hits) or its current completion's (``stamps[2x + 1]``,
    stored since: ``cmask[x]``), so a hit refreshes every capacity at once. ``log[t]``: stamp
    t's object, superseded at every capacity from stamp ``sup[t]`` on (``completion_log``); the
    scans link past those (``alive[t] != t``). ``miss``: the request's miss bits."""
    nk = len(caps)
    width = len(out) // nk
    used, tail = np.zeros(nk, np.int64), np.zeros(nk, np.int64)
    t = 0
    active = (1 << nk) - 1
    for r in range(len(row_start) - 1):
        a = row_start[r]
        any_miss = 0
        for i in range(a, row_start[r + 1]):  # lookups
            x = ids[i]
            miss[i - a] = active & ~pres[x]
            any_miss |= miss[i - a]
            stamps[2 * x] = t  # every present entry refreshed
            stamps[2 * x + 1] = -1
            cmask[x] = 0
            t += 1
            m, bx, tx, mx = miss[i - a], info[4 * x], info[4 * x + 1], 4 + 3 * info[4 * x + 2]
            for k in range(nk * (m != 0)):
                o = k * width
                for _ in range(((m >> k) & 1) * (1 + (width > 4))):  # all, then the modality
                    out[o] += 1
                    out[o + 1] += bx
                    out[o + 2] += tx
                    o = k * width + mx
        for k in range(nk):  # requests with a miss; capacities past their stop
            out[k * width + 3] += (any_miss >> k) & 1
            if out[k * width] > stop[k] >= 0:
                active &= ~(1 << k)
        for i in range(a, row_start[r + 1]):  # completion: misses stored
            x, m, s = ids[i], miss[i - a], w[ids[i]]
            stamps[2 * x + 1] = t if m else stamps[2 * x + 1]  # no miss: no access
            for k in range(nk * (m != 0)):
                if not (m >> k) & 1 or (s > caps[k] and not flush):
                    continue
                if (pres[x] >> k) & 1 or s <= caps[k]:
                    used[k] += s * (1 - ((pres[x] >> k) & 1))
                    pres[x] |= 1 << k
                    cmask[x] |= 1 << k
                while used[k] > caps[k] * (s <= caps[k]):  # too large: the cache is flushed
                    q = tail[k]
                    while alive[q] != q or sup[q] <= t:  # skip superseded stamps, linking them
                        alive[q] = max(alive[alive[q]], q + 1)
                        q = alive[q]
                    y = log[q]
                    if (pres[y] >> k) & 1 and stamps[2 * y + ((cmask[y] >> k) & 1)] == q:
                        pres[y] &= ~(1 << k)
                        used[k] -= w[y]
                    tail[k] = q + 1
            t += 1
    return out


def completion_log_kernel(row_start, ids, nlook, ndone, nrow, log, sup):
    """One request at a time, each looked up then completed (request r's lookups are stamps
    2 start(r) + j, its completions follow): ``log[t]`` the object of access stamp t, ``sup[t]``
    the stamp from which a later access supersedes it at every capacity (the object's next
    lookup; for a completion also its next completion in the same request; 2n + 1: never).
    ``nlook``/``ndone``/``nrow`` per object: 2n + 1, 2n + 1, -1 (work buffers)."""
    end = 2 * len(ids) + 1
    for r in range(len(row_start) - 2, -1, -1):
        a, b = row_start[r], row_start[r + 1]
        for i in range(b - 1, a - 1, -1):
            x = ids[i]
            look = a + i
            done = look + b - a
            log[look] = x
            log[done] = x
            sup[look] = nlook[x]
            sup[done] = ndone[x] if nrow[x] == r else nlook[x]
            nlook[x] = look
            ndone[x] = done
            nrow[x] = r
    sup[end - 1] = end
    return sup


def bounds_kernel(row_start, ids, bounds, prev, obj, tree, slot_obj, state, unit, scale):
    """Insert at completion, one request at a time, at capacities where every entry fits: per
    reference, the capacities below which it misses and from which it hits (``bounds[2i]``,
    ``bounds[2i + 1]`` in the entry unit; ``bounds[2n + 2i]``, ``[2n + 2i + 1]`` in entries;
    -1: never hits), and its object's previous reference (``prev``, -1: none). A lookup hits
    iff its size plus all sizes above it in the recency order fit (see ``sampled``): the
    objects of every later request (a Fenwick tree over recency slots, as ``stack_kernel``,
    a node holding size * ``unit`` + 1 per object; sizes in units of ``scale``), and those of
    its last request Q placed above it (none to all of Q's others, by their hits).
    ``obj[8x:8x + 8]``: x's last reference and request, slot, first and last reference in the
    current request, size, its last request's first and last slot; ``state``: next request,
    next slot, total size, objects; returns when a request may not find free slots."""
    cap, half = len(slot_obj) - 1, 2 * len(ids)
    r, nslot, total, seen = state[0], state[1], state[2], state[3]
    while r < len(row_start) - 1 and nslot + row_start[r + 1] - row_start[r] <= cap + 1:
        a, b = row_start[r], row_start[r + 1]
        first = nslot  # the request's objects take the next slots, one each
        for i in range(a, b):  # lookups
            o = 8 * ids[i]
            f, first = obj[o + 3], first - (obj[o + 3] < a)
            prev[i] = obj[o + 4] if f >= a else obj[o]
            obj[o + 4], p = i, prev[i]
            if f >= a or p < 0:  # a repeat inside the request (as its first copy), or new
                for c in (0, 1, half, half + 1):
                    bounds[2 * i + c] = bounds[2 * f + c] if f >= a else -1
                obj[o + 3] = f if f >= a else i
                continue
            obj[o + 3], k, pre, acc = i, obj[o + 2], 0, 0
            while k > 0:
                pre, k = pre + tree[k], k - (k & -k)
            for side in range(2):  # Q's block: its others still there before x's slot, then
                before = acc  # after it: sums over (lo, hi], walked from both ends until they
                lo = obj[o + 6 - 4 * side] - 1 + side  # meet (a few steps: they are close)
                hi, acc = obj[o + 2 + 5 * side] - 1 + side, 0
                while lo != hi:
                    up = hi > lo
                    acc += (2 * up - 1) * tree[lo + up * (hi - lo)]
                    hi, lo = hi - up * (hi & -hi), lo - (1 - up) * (lo & -lo)
            top, top1 = obj[o + 5] + total - pre // unit, 1 + seen - pre % unit
            bounds[2 * i], bounds[2 * i + 1] = ((top - acc // unit) * scale,
                                                (top + before // unit) * scale)
            bounds[half + 2 * i], bounds[half + 2 * i + 1] = (top1 - acc % unit,
                                                              top1 + before % unit)
        first, last = nslot, 2 * nslot - first - 1  # the block of slots they take
        for i in range(a, b):  # completion: the request's objects on top, last use first
            o = 8 * ids[i]
            if obj[o + 4] != i:
                continue
            k, s = obj[o + 2], obj[o + 5]
            total, seen = total + s * (k == 0), seen + (k == 0)
            slot_obj[k] = -1
            while 0 < k <= cap:
                tree[k], k = tree[k] - s * unit - 1, k + (k & -k)
            k, obj[o + 2], slot_obj[nslot], nslot = nslot, nslot, ids[i], nslot + 1
            while k <= cap:
                tree[k], k = tree[k] + s * unit + 1, k + (k & -k)
            obj[o], obj[o + 1], obj[o + 6], obj[o + 7] = i, r, first, last
        r += 1
    state[0], state[1], state[2], state[3] = r, nslot, total, seen
    return state


def bounds_join_kernel(row_start, ids, bounds, prev, obj, tree, first_row, done, unit, scale):
    """``bounds_kernel``'s results over the requests from ``first_row`` on, passed alone
    (``bounds`` and ``prev`` at the trace's positions: -1 at each first reference within them),
    joined to the pass over the requests before (``obj``, ``tree``: that pass's buffers at its
    end; ``unit``, ``scale``: as there). The first lookup there of an object seen before sees
    the earlier pass's recency slots less the objects completed since (removed from ``tree``
    as their requests complete; ``done``: 0 per object, 1 once completed there), with those
    completed objects above it."""
    cap, half = len(tree) - 1, 2 * len(ids)
    both = moved = moved1 = 0
    k = cap
    while k > 0:
        both, k = both + tree[k], k - (k & -k)
    total, seen = both // unit, both % unit
    for r in range(first_row, len(row_start) - 1):
        a, b = row_start[r], row_start[r + 1]
        for i in range(a, b):  # lookups
            o, p = 8 * ids[i], prev[i]
            if p >= a:  # a repeat inside the request: as its previous copy
                for c in (0, 1, half, half + 1):
                    bounds[2 * i + c] = bounds[2 * p + c]
                continue
            if p >= 0 or obj[o] < 0:
                continue  # its last request is in this part, or it is new
            k, pre = obj[o + 2], 0
            while k > 0:
                pre, k = pre + tree[k], k - (k & -k)
            k, before = obj[o + 6] - 1, pre - obj[o + 5] * unit - 1
            while k > 0:
                before, k = before - tree[k], k - (k & -k)
            k, after = obj[o + 7], -pre
            while k > 0:
                after, k = after + tree[k], k - (k & -k)
            top = obj[o + 5] + total - pre // unit + moved
            top1 = 1 + seen - pre % unit + moved1
            bounds[2 * i], bounds[2 * i + 1] = ((top - after // unit) * scale,
                                                (top + before // unit) * scale)
            bounds[half + 2 * i], bounds[half + 2 * i + 1] = (top1 - after % unit,
                                                              top1 + before % unit)
            prev[i] = obj[o]
        for i in range(a, b):  # completion: the request's objects leave the earlier slots
            x = ids[i]
            if done[x]:
                continue
            done[x], s, k = 1, obj[8 * x + 5], obj[8 * x + 2]  # slot 0: not in the earlier
            moved, moved1 = moved + s, moved1 + 1
            if k > 0:
                total, seen = total - s, seen - 1
            while 0 < k <= cap:
                tree[k], k = tree[k] - s * unit - 1, k + (k & -k)
    return bounds


def compact_kernel(obj, tree, slot_obj, state, unit):
    """``bounds_kernel``'s slots renumbered 1..live in order (each request's block of slots
    with them), its Fenwick tree rebuilt: one pass over the slots, each live object's record
    read once (a block's last slot is set in its objects as the block ends)."""
    cap = len(slot_obj) - 1
    live, run_req, run_first = 0, -2, 1
    for j in range(1, cap + 1):
        o = slot_obj[j]
        if o < 0:
            continue
        live += 1
        slot_obj[j], slot_obj[live] = -1, o
        rec = 8 * o
        if obj[rec + 1] != run_req:  # a block ends at the slot before: its last slot
            for t in range(run_first, live):
                obj[8 * slot_obj[t] + 7] = live - 1
            run_req, run_first = obj[rec + 1], live
        obj[rec + 2], obj[rec + 6] = live, run_first
        tree[live] = obj[rec + 5] * unit + 1
    for t in range(run_first, live + 1):
        obj[8 * slot_obj[t] + 7] = live
    for j in range(live + 1, cap + 1):
        tree[j] = 0
    for j in range(1, cap + 1):
        k = j + (j & -j)
        if k <= cap:
            tree[k] += tree[j]
    state[1] = live + 1
    return state


def hits_kernel(bounds, col, caps, mask, amb, start, end):
    """Hit bits of references ``start`` to ``end`` (``mask[i]``: bit k where reference i hits
    at capacity k; ``caps`` ascending, at most 62, each holding every entry) from
    ``bounds_kernel``'s bounds (``col`` 0: the entry unit, 2n: entries): below the low bound a
    miss, from the high bound a hit. The references with capacities between their bounds are
    listed in ``amb`` from ``start`` for ``decide_kernel``; returns where the list ends."""
    nk, full, namb = len(caps), (1 << len(caps)) - 1, start
    for i in range(start, end):
        lo, hi = bounds[col + 2 * i], bounds[col + 2 * i + 1]
        if hi <= caps[0] or lo < 0 or lo > caps[nk - 1]:  # the same at every capacity
            mask[i] = full if hi <= caps[0] and lo >= 0 else 0
            continue
        jl, top = 0, nk  # capacities below lo: jl; below hi: jh
        while jl < top:
            mid = (jl + top) >> 1
            if caps[mid] < lo:
                jl = mid + 1
            else:
                top = mid
        jh = jl
        while jh < nk and caps[jh] < hi:
            jh += 1
        mask[i] = full & ~((1 << jh) - 1) if lo >= 0 else 0
        if lo >= 0 and jl < jh:
            amb[namb] = i
            namb += 1
    return namb


def decide_kernel(row_start, ref_row, ids, w, bounds, col, prev, nxt, caps, mask, amb, start,
                  end):
    """``hits_kernel``'s undecided references ``amb[start:end]``, in trace order (those of
    every earlier reference decided first): x's need at capacity k is, when
    x hit in its last request Q, the high bound minus Q's others looked up before x that hit
    there, else the low bound plus Q's others looked up after x that missed there (others
    still there: not used again before this request)."""
    for t in range(start, end):
        i = amb[t]
        p, a, x = prev[i], row_start[ref_row[i]], ids[i]
        if p >= a:  # a repeat inside the request: as its previous copy
            mask[i] = mask[p]
            continue
        lo, hi, q = bounds[col + 2 * i], bounds[col + 2 * i + 1], ref_row[p]
        for k in range(len(caps)):
            if caps[k] < lo or caps[k] >= hi:
                continue
            hit = (mask[p] >> k) & 1
            need = hi if hit else lo
            for j in range(row_start[q], row_start[q + 1]):
                if ids[j] == x or 0 <= nxt[j] < a or hit != (j < p):
                    continue  # x itself, used again since, or on the side that stays
                if hit == ((mask[j] >> k) & 1):  # before x and hit, or after x and missed
                    need += (w[ids[j]] if col == 0 else 1) * (1 - 2 * hit)
            mask[i] |= int(caps[k] >= need) << k
    return mask


def miss_count_kernel(row_start, ids, info, mask, bitpos, runs, out, first, last):
    """Misses of requests ``first`` to ``last`` from hit bits (``mask``, ``len(runs) // width
    - 1`` capacities), counted as
    ``fifo_batch_kernel`` counts them: a reference (or request) missing at one run of
    capacities [lo, hi) is added at its ends in ``runs`` (+1 at lo, -1 at hi; summed into
    ``out`` at the end); others bit by bit (``bitpos[b % 67]``: the position of the bit b)."""
    width = len(runs) - len(out)
    nk = len(out) // width
    full = (1 << nk) - 1
    for r in range(first, last):
        any_miss = 0
        for i in range(row_start[r], row_start[r + 1]):
            m = full & ~mask[i]
            any_miss |= m
            if m == 0:
                continue
            x = ids[i]
            low = m & -m
            one_run = ((m + low) & m) == 0
            bx, tx, mx = info[4 * x], info[4 * x + 1], 4 + 3 * info[4 * x + 2]
            for end in range(2 * one_run):
                o, sign = bitpos[(low + m * end) % 67] * width, 1 - 2 * end
                for _ in range(1 + (width > 4)):  # all, then the modality
                    runs[o], runs[o + 1], runs[o + 2] = (runs[o] + sign, runs[o + 1] + sign * bx,
                                                         runs[o + 2] + sign * tx)
                    o = o - o % width + mx
            while m and not one_run:
                low = m & -m
                m ^= low
                o = bitpos[low % 67] * width
                for _ in range(1 + (width > 4)):
                    out[o], out[o + 1], out[o + 2] = out[o] + 1, out[o + 1] + bx, out[o + 2] + tx
                    o = o - o % width + mx
        low = any_miss & -any_miss
        one_run = any_miss != 0 and ((any_miss + low) & any_miss) == 0
        if one_run:  # requests with a miss
            runs[bitpos[low % 67] * width + 3] += 1
            runs[bitpos[(any_miss + low) % 67] * width + 3] -= 1
        while any_miss and not one_run:
            low = any_miss & -any_miss
            any_miss ^= low
            out[bitpos[low % 67] * width + 3] += 1
    for c in range(width, width * nk):  # the runs' counts, summed over capacities, into out
        runs[c] += runs[c - width]
    for c in range(width * nk):
        out[c] += runs[c]
    return out


def small_completion_kernel(row_start, ids, rec, caps, stack, stack_at, miss, out):
    """Insert at completion, one request at a time, at capacities in bytes that hold a few
    entries each (at most 62; capacity k's entries in ``stack[stack_at[k]:stack_at[k + 1]]``,
    room for all of them and one more, most recent first): counts as ``fifo_batch_kernel``, in
    ``out``'s first rows (a last row counts the references that missed at every capacity).
    ``rec[4x:4x + 4]``: x's presence bits (bit k: held at capacity k), size, tokens and
    modality, in one cache line (``lines``). ``miss``: the request's miss bits."""
    nk = len(caps)
    width, full = len(out) // (nk + 1), (1 << nk) - 1
    depth, used = np.zeros(nk, np.int64), np.zeros(nk, np.int64)
    for r in range(len(row_start) - 1):
        a, b = row_start[r], row_start[r + 1]
        any_miss = 0
        for i in range(a, b):  # lookups: a hit moves to the top
            x = 4 * ids[i]
            m = full & ~rec[x]
            miss[i - a], any_miss = m, any_miss | m
            for k in range(nk * (m != full)):
                o, s0 = k * width, stack_at[k]
                for _ in range(((m >> k) & 1) * (1 + (width > 4))):  # all, then the modality
                    out[o], out[o + 1], out[o + 2] = (out[o] + 1, out[o + 1] + rec[x + 1],
                                                      out[o + 2] + rec[x + 2])
                    o = k * width + 4 + 3 * rec[x + 3]
                if (m >> k) & 1:
                    continue  # a miss: nothing moves
                pos = s0
                while stack[pos] != x:
                    pos += 1
                for j in range(pos, s0, -1):
                    stack[j] = stack[j - 1]
                stack[s0] = x
            o = nk * width  # missed everywhere: counted once, in the extra row
            for _ in range((m == full) * (1 + (width > 4))):
                out[o], out[o + 1], out[o + 2] = (out[o] + 1, out[o + 1] + rec[x + 1],
                                                  out[o + 2] + rec[x + 2])
                o = nk * width + 4 + 3 * rec[x + 3]
        for k in range(nk):
            out[k * width + 3] += (any_miss >> k) & 1
        for i in range(a, b):  # completion: misses stored (a present one refreshed)
            x, m = 4 * ids[i], miss[i - a]
            for k in range(nk * (m != 0)):
                if ((m >> k) & 1) * (rec[x + 1] <= caps[k]) == 0:
                    continue
                s0, held = stack_at[k], (rec[x] >> k) & 1
                pos = s0 + depth[k] * (1 - held)  # not held: the stack grows by one
                while held and stack[pos] != x:
                    pos += 1
                depth[k], used[k] = depth[k] + 1 - held, used[k] + rec[x + 1] * (1 - held)
                rec[x] |= 1 << k
                for j in range(pos, s0, -1):
                    stack[j] = stack[j - 1]
                stack[s0] = x
                while used[k] > caps[k]:
                    depth[k] -= 1
                    used[k] -= rec[stack[s0 + depth[k]] + 1]
                    rec[stack[s0 + depth[k]]] &= ~(1 << k)
    for c in range(nk * width):  # the extra row's counts (not its requests) to every capacity
        out[c] += out[nk * width + c % width] * (c % width != 3)
    return out[:nk * width]
