"""The loader's cache prediction: what the server's cache target does with the requests it sent.

Each request's images (its own and, for multi_turn, the history it resends) are identified and
sized by the one service the analysis and the simulator use (``io/imageref``,
``caches/entries``) under the target's key mode and entry rule, as the request starts. After
the run the requests are replayed through the target's cache model (``mmdatagen.caches``, the
simulator's own implementation) in the order the server's cache saw them:

- the simulator publishes that order (its cache timeline, per X-Request-ID): the prediction is
  then exact;
- a server's log that names every request (``--server-log``; vLLM's --enable-log-requests logs
  "Received request chatcmpl-<X-Request-ID>" as its caches take each request): that order,
  exact;
- any other server: the first-token order. An engine that serves first come, first served
  (vLLM's, SGLang's and Dynamo's default) looks requests up in arrival order and never gives a
  later request its first token earlier, so the first tokens the client saw give the order, up
  to the requests of one engine step. A target's later moment (encoder done, entries released,
  request complete) comes when the client saw the first token or the end of the response.
  Exact at concurrency 1. With concurrent requests the prediction carries the order band
  (``loadgen/band.py``): the lowest and highest hits over every order first come, first served
  allows given the first tokens, and, beside it, over every order the send and first-byte times
  allow whatever the scheduler. For vLLM's encoder cache (alone or in front of Dynamo's tier),
  which frees each item at the end of the step whose prefill chunk passes it, the first-come
  band is ``loadgen/chunked.py``'s (the prompts as one stream cut into steps).

Against a real engine the cache model also fails where the engine's own bug does (vLLM 0.32's
processor-cache mirror, ``caches.model``'s ``stale_fault``): such a request counts its lookups
up to the failing item, and the prediction says how many requests fail (``faults``).

The requests counted are those the engine processed (``outcomes.engine_processed``: an empty
200 or a 5xx after preprocessing counts; a refused connection or a 4xx does not).
"""
from __future__ import annotations

import re
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import numpy as np

from ..caches import TIMELINE_PATH, CacheTarget
from ..caches.entries import (
    DEFAULT_BATCHED_TOKENS,
    entry_size,
    front_budget,
    image_flags,
    make_target_cache,
    request_items,
)
from ..caches.items import RequestItems
from ..errors import DatasetError, UserError
from ..io.imageref import DEFAULT_URL_SIZE, ImageIdentifier
from ..io.readers import Turn
from ..metrics import NONE, RecordTable
from ..outcomes import engine_processed_rows
from ..vlm import VisionModel
from .band import MAX_GROUP, SEARCH_BUDGET, fcfs_windows, known_order, order_band
from .chunked import MAX_SET_MEMBERS, first_come_band, steps

if TYPE_CHECKING:
    from ..analysis.tiers import Front

#: cache events in the server's order: their kinds (0: lookup, 1: later moment reached,
#: 2: failed before it) and their requests (dispatch indices)
Events = tuple[np.ndarray, np.ndarray]


class _MediaError(Exception):
    """A media part the prediction cannot size (the server answers 400 to it)."""

    def __init__(self, status: int = 400, message: str = "") -> None:
        super().__init__(message)


@dataclass(slots=True)
class _Request:
    items: list[tuple]
    images: int


class RequestColumns(Sequence):
    """The started requests (dispatch order) as columns: their cache items and image counts
    (``merge-runs`` reads a million of them so; a bench run's list becomes them to predict).
    Indexing gives a request."""

    def __init__(self, items: RequestItems, images: np.ndarray) -> None:
        self.items, self.images = items, np.asarray(images, np.int64)

    @classmethod
    def of(cls, requests: Sequence[_Request]) -> RequestColumns:
        if isinstance(requests, RequestColumns):
            return requests
        return cls(RequestItems.of([r.items for r in requests]),
                   np.fromiter((r.images for r in requests), np.int64, len(requests)))

    def __len__(self) -> int:
        return len(self.items)

    def __getitem__(self, i):
        return _Request(self.items[i], int(self.images[i]))


@dataclass
class ImageTracker:
    """Collects each started request's cache items (dispatch order)."""

    model: VisionModel
    target: CacheTarget
    capacity: float  # in the target's own unit
    encoder: Any
    front: int | None = None  # a two-tier target's front budget in tokens (resolved)
    requests: Sequence[_Request] = field(default_factory=list)  # a list while a run starts them
    undecodable: int = 0
    timeline: dict | None = None  # the simulator's cache events per X-Request-ID, if fetched
    real_engine: bool = True  # replays model the engine's own faults (no simulator timeline)
    server_order: dict[str, int] | None = None  # X-Request-ID -> place in the server's log
    order_note: str | None = None  # why the server's log could not give the order
    faulted: list[int] = field(default_factory=list)  # requests the replay failed (stale_fault)

    def __post_init__(self) -> None:
        self.identify = ImageIdentifier(self.target.key, memo_size=1 << 16)
        self._media_resolver: Any = None
        self._sizes: dict[tuple[int, int], int] = {}

    def _size(self, w: int, h: int) -> int:
        size = self._sizes.get((w, h))
        if size is None:
            size = self._sizes[(w, h)] = entry_size(self.target, self.model, w, h)
        return size

    def _key_size(self, url: str, uuid: str | None) -> tuple[tuple, int]:
        try:
            ident = self.identify(url, uuid)
            w, h = ident.width, ident.height
        except DatasetError:
            self.undecodable += 1
            ident, w, h = None, 0, 0
        if w <= 0:
            w, h = DEFAULT_URL_SIZE
        key = ident.key if ident is not None else ("undecodable", url)
        return key, self._size(w, h)

    def _media(self, part: dict) -> tuple[tuple, int]:
        """A ``video_url`` / ``input_audio`` part, keyed and sized as the simulator does."""
        if self._media_resolver is None:
            from ..io.mediaref import MediaResolver

            self._media_resolver = MediaResolver(self.model, self.target, _MediaError)
        kind = "video" if part.get("type") == "video_url" else "audio"
        try:
            return getattr(self._media_resolver, kind)(
                part, lambda key, tokens, prompt, size, remote: (key, size))
        except (_MediaError, DatasetError):
            self.undecodable += 1
            return ("undecodable", kind, len(self.requests)), 0

    def on_start(self, turn: Turn, history: list[dict] | None) -> None:
        """Called just before a request is sent (so in dispatch order): the request's media
        parts exactly as they go on the wire (history first, then the turn: texts, images,
        audios, videos), each identified and sized as the server's cache would."""
        from .payload import user_content

        parts: list[dict] = []
        for msg in history or ():
            content = msg.get("content")
            if isinstance(content, list):
                parts.extend(content)
        content = user_content(turn, self.encoder)
        if isinstance(content, list):
            parts.extend(content)
        keys, sizes = [], []
        for part in parts:
            ptype = part.get("type")
            if ptype == "image_url":
                key, size = self._key_size(part["image_url"]["url"], part.get("uuid"))
            elif ptype in ("video_url", "input_audio"):
                key, size = self._media(part)
            else:
                continue
            keys.append(key)
            sizes.append(size)
        assert isinstance(self.requests, list)
        self.requests.append(_Request(request_items(self.target, keys, sizes), len(keys)))

    # -- after the run ------------------------------------------------------------------------
    def events(self, rows: _Rows, timeline: dict | None) -> tuple[Events, str]:
        """Cache events as the server saw them (kinds and request indices, in its order), and
        how the order was known."""
        if timeline is not None:
            return self._timeline_events(rows, timeline), "the server's cache timeline (exact)"
        seen = np.flatnonzero(rows.present)
        processed = seen[engine_processed_rows(rows.failed(seen), rows.tokened(seen),
                                               rows.col("http_status", seen))]
        logged = self.logged(rows, processed)
        later, moments = self._later, self.later_moments(rows, processed)
        if logged is not None:
            keys = 2 * np.array(logged, np.int64)
            at = keys + 1
            how = "the server's log order (exact)" + (
                ", later moments right after each lookup" if later else "")
        else:
            fcfs = _fcfs_keys(rows, processed)
            keys = rows.col("start_ns", processed) if fcfs is None else fcfs
            at = moments
            how = ("request start order" if fcfs is None else
                   "first-token order (the engine serves first come, first served)")
            how += ", later moments at first token / end of response" if later else ""
        order, kind, req = [keys], [np.zeros_like(processed)], [processed]
        if later:
            has = moments != NONE
            order.append(at[has])
            kind.append(self.later_kinds(rows, processed[has]))
            req.append(processed[has])
        return _sorted_events(*map(np.concatenate, (order, kind, req))), how

    @property
    def _later(self) -> bool:
        """The target has a later moment per request (entries released, or present only
        after encoding or completion)."""
        return self.target.releases or not self.target.insert_on_lookup

    def _timeline_events(self, rows: _Rows, timeline: dict) -> Events:
        out: list[tuple] = []
        xids = rows.table.x_request_id
        for i, row in enumerate(rows.row.tolist()):
            seqs = timeline.get(xids[row]) if row >= 0 else None
            if not seqs or seqs[0] is None:
                continue  # never looked up (rejected before the cache)
            out.append((seqs[0], 0, i))
            if self._later and seqs[1] is not None:
                out.append((seqs[1], 1, i))
        order, kind, req = (np.array(c, np.int64) for c in zip(*out)) if out else (
            np.zeros(0, np.int64),) * 3
        return _sorted_events(order, kind, req)

    def logged(self, rows: _Rows, idx: np.ndarray) -> list[int] | None:
        """The place in the server's log (``server_order``) of the requests ``idx``, or None
        when there is no log or it misses one of them (the first-token order answers then)."""
        if not self.server_order:
            return None
        places = [self.server_order.get(x) for x in rows.col("x_request_id", idx).tolist()]
        return None if any(p is None for p in places) else places  # type: ignore[return-value]

    def later_moments(self, rows: _Rows, idx: np.ndarray) -> np.ndarray:
        """When the client saw the requests ``idx`` pass the target's later moment
        (``NONE``: not seen): the first token (the end of the response for a target whose
        entries appear at completion), else, for a failed request, its reply's end."""
        t = rows.col("first_token_ns" if self.target.present != "completion" else "end_ns", idx)
        failed_end = np.where(rows.failed(idx), rows.col("response_end_ns", idx), NONE)
        return np.where(t != NONE, t, failed_end)

    @staticmethod
    def later_kinds(rows: _Rows, idx: np.ndarray) -> np.ndarray:
        """1: the request reached its later moment; 2: it failed before (an engine fault or
        an empty reply): its entries are released, nothing becomes present for it."""
        return np.where(~rows.failed(idx) | rows.tokened(idx), 1, 2)

    def new_cache(self, capacity: int) -> Any:
        """The target's empty cache. Against a real engine (no simulator timeline) it fails
        where the engine's own bugs do (``caches.model``'s ``stale_fault``: vLLM's
        processor-cache mirror), so a failed request counts the lookups the engine made."""
        return make_target_cache(self.target, self.model, capacity, self.front,
                                 engine_faults=self.real_engine)

    def replay(self, events: Events) -> tuple[np.ndarray, np.ndarray]:
        """Predicted hits and lookups per request, replaying ``events`` through the target's
        cache (a two-tier target's lookups are its own: a front-tier hit never reaches it).
        vLLM's encoder cache, alone or before Dynamo's connector, replays compiled
        (``analysis.tiers.event_hits``, the same rules: ``tests/test_two_tier.py``)."""
        from ..analysis.tiers import event_hits

        capacity = self.target.capacity(self.capacity)
        compiled = self._compiled_tiers(capacity)
        if compiled is not None:
            cols = RequestColumns.of(self.requests)
            return event_hits(cols.items, events[0], events[1], *compiled)
        cache = self.new_cache(capacity)
        hits = np.zeros(len(self.requests), np.int64)
        looked = np.zeros(len(self.requests), np.int64)
        for kind, i in zip(*(e.tolist() for e in events)):
            if kind:
                (cache.finish if kind == 1 else cache.abort)(i)
                continue
            req = self.requests[i]
            flags = image_flags(self.target, cache.lookup(i, req.items), req.images)
            hits[i] = sum(flags)
            looked[i] = len(flags) - sum(cache.last_front)
            if getattr(cache, "last_fault", None) is not None:
                self.faulted.append(i)
        return hits, looked

    def _compiled_tiers(self, capacity: int) -> tuple[Front, int | None] | None:
        """The front tier and the connector's capacity (None: the front alone) where the
        target's cache is vLLM's encoder cache, alone or before Dynamo's connector."""
        from ..analysis.tiers import Front

        t = self.target
        if t.front is not None:
            budget = front_budget(t, self.model, self.front)
            assert budget is not None
            return Front(int(budget), int(self.model.bytes_per_token)), capacity
        if t.eviction == "freeable":
            return Front(int(capacity), 1), None
        return None

    def predict(self, table: RecordTable, profiling: np.ndarray, timeline: dict | None = None,
                slack_ns: np.ndarray | None = None, band_later: bool = False) -> dict:
        """Hit counts over the profiling requests (warmup requests warm the cache), with the
        order band (``slack_ns``: per dispatch index, how far the request's clock may be off
        the server's; merge-runs' workers; ``band_later``: the band is left as the function
        that makes it, for :func:`settle_band`: merge-runs makes it while its writers write)."""
        if not self.requests:
            return {"references": 0, "hits": 0, "misses": 0, "hit_rate": None}
        self.real_engine = timeline is None
        self.faulted = []
        self.requests = RequestColumns.of(self.requests)  # once: the replay and bands read them
        rows = _Rows(table, len(self.requests))
        events, how = self.events(rows, timeline)
        per_req, refs = self.replay(events)
        looked = np.zeros(len(self.requests), bool)
        looked[events[1][events[0] == 0]] = True
        keep = looked & (profiling[:len(self.requests)] if profiling.size else True)
        h, n = int(per_req[keep].sum()), int(refs[keep].sum())
        exact = (h, int(per_req[looked].sum()))

        def band() -> dict:
            out = (_known_band(exact, "the server's cache timeline") if timeline is not None
                   else self.band(rows, looked, keep, exact, slack_ns))
            out["family"] = _family(self.target)
            return out
        out = {"references": n, "hits": h, "misses": n - h, "hit_rate": h / n if n else None,
               "order": how, "band": band if band_later else band(), "per_request_hits": per_req}
        if self.faulted:  # the engine's own bug, predicted: these requests fail at an item
            out["faults"] = {kind: len(self.faulted) for kind in self.target.faults}
        return out

    def band(self, rows: _Rows, looked: np.ndarray, keep: np.ndarray,
             exact: tuple[int, int], slack_ns: np.ndarray | None) -> dict:
        """The order band over the requests the engine processed (``band.order_band``): for
        the profiling requests (the prediction's hits) and for every request (what the server's
        counters cover). Two: over the orders a first-come-first-served engine allows given the
        first tokens (``band.fcfs_windows``; the band reported), and over every order the send
        and first-byte times allow, whatever the scheduler (``any_order``)."""
        slack = np.zeros(len(self.requests), np.int64) if slack_ns is None else slack_ns
        seen = np.flatnonzero(looked)  # in send order on the server's clock, ties by index
        idx = seen[np.lexsort((seen, rows.col("start_ns", seen) - slack[seen]))]
        t = _Times(rows, idx, slack[idx].astype(np.int64),
                   self.later_moments(rows, idx) if self._later else None)
        weights = [keep[idx].astype(np.float64), np.ones(len(idx))]
        fail = (self.later_kinds(rows, idx) == 2).tolist()
        logged = self.logged(rows, idx)
        if logged is not None:
            return self.logged_band(idx, np.array(logged, np.int64), t, weights, fail, exact)
        s, f, fin = t.start - t.slack, t.reply + t.slack, t.fin
        if known_order(s, f if fin is None else np.maximum(f, fin + t.slack)):
            return _known_band(exact, "known (no two requests' windows overlap)")
        any_fin = None if fin is None else fin + t.slack
        if not (t.first >= 0).any():
            return self._band(idx, s, f, any_fin, None, weights, fail)
        w = fcfs_windows(t.start, t.first, t.reply, fin, t.slack)
        if w.largest > MAX_GROUP:  # first tokens not apart in steps (no engine, or a fast one)
            return self._any_order(idx, s, f, any_fin, weights, fail, (
                f"{w.largest:,} first tokens within {w.tie_ns / 1e6:.3g} ms of each other: no "
                "engine steps to order them"))
        pos = np.argsort(w.lo, kind="stable")
        if self._frees_by_item(t):
            fcfs = self._chunked(idx[pos], w.lo[pos], [wt[pos] for wt in weights], False)
        else:
            fcfs = self._band(idx[pos], w.lo[pos], w.hi[pos],
                              None if w.later_hi is None else w.later_hi[pos],
                              None if w.later_lo is None else w.later_lo[pos],
                              [wt[pos] for wt in weights], [fail[p] for p in pos])
        if fcfs is None:  # the chunked search gave up: the band over any order answers
            return self._any_order(idx, s, f, any_fin, weights, fail, "the chunked search "
                                   "gave up: past its work budget, or a step of over "
                                   f"{MAX_SET_MEMBERS} requests")
        fcfs["order"] = (f"first come, first served: lookups in first-token order, first tokens "
                         f"within {w.tie_ns / 1e6:.3g} ms of each other (one engine step) in either "
                         "order" + (
                             "; the stream of prompts cut into steps anywhere in each step's "
                             "first prompt, an item freed at the end of the step that passes it "
                             "(``loadgen.chunked``)" if self.target.releases else ""))
        # over more orders, a search that ran out of budget over the first-come ones would too;
        # the band beside the reported one gets a quarter of the work
        any_order = self._band(idx, s, f, any_fin, None, weights, fail, after=fcfs["method"],
                               budget=SEARCH_BUDGET // 4)
        any_order["order"] = "any: every order the send and first-byte times allow"
        return {**fcfs, "any_order": any_order}

    def _any_order(self, idx: np.ndarray, s: np.ndarray, f: np.ndarray,
                   fin: np.ndarray | None, weights: list[np.ndarray], fail: list[bool],
                   why: str) -> dict:
        out = self._band(idx, s, f, fin, None, weights, fail)
        out["order"] = f"any: every order the send and first-byte times allow ({why})"
        return out

    def _chunked(self, idx: np.ndarray, group: np.ndarray, weights: list[np.ndarray],
                 ordered: bool) -> dict | None:
        """The band of vLLM's encoder cache over the orders of a first-come-first-served
        engine with chunked prefill (``loadgen.chunked``): ``group``, per request (in the
        groups' order), its first-token group; ``ordered``: the requests are in arrival order.
        None when the search gave up (``chunked.first_come_band``)."""
        items = RequestColumns.of(self.requests).items.take(idx)
        got = first_come_band(steps(group), items, np.array(weights, np.float64),
                              self.new_cache(self.target.capacity(self.capacity)),
                              ordered=ordered)
        return None if got is None else _band_out(*got)

    def _frees_by_item(self, t: _Times) -> bool:
        """The chunked band applies: the target frees item by item (``releases``) and every
        request has a first token."""
        return bool(self.target.releases and (t.first >= 0).all())

    def logged_band(self, idx: np.ndarray, place: np.ndarray, t: _Times,
                    weights: list[np.ndarray], fail: list[bool], exact: tuple[int, int]) -> dict:
        """The band when the server's log gives the lookup order: width 0 unless a target's
        later moments (releases, completions) are open: each after its own lookup and before
        the lookup of the first request, in the log, sent after the client saw the moment. (Not
        before the next engine step's lookups: a prefill chunked over several steps frees an
        item at the end of a step in which later requests have looked up theirs.)"""
        if t.fin is None:
            return _known_band(exact, "the server's log order")
        pos = np.argsort(place, kind="stable")
        if self._frees_by_item(t):
            # the log orders each step's requests; the steps' cuts are still open
            w = fcfs_windows(t.start[pos], t.first[pos], t.reply[pos], None, t.slack[pos])
            if np.all(np.diff(w.lo) >= 0):
                out = self._chunked(idx[pos], w.lo, [wt[pos] for wt in weights], True)
                if out is not None:
                    out["order"] = ("the server's log order, each step's prompts cut anywhere in "
                                    "its first one (``loadgen.chunked``)")
                    return out
        place, start, fin = place[pos], t.start[pos], t.fin[pos]
        by_send = np.argsort(start, kind="stable")
        low_after = np.minimum.accumulate(place[by_send][::-1])[::-1]
        nxt = np.searchsorted(start[by_send], fin, side="right")
        top = 2 * int(place.max()) + 3
        hi = np.where(nxt < place.size, 2 * low_after[np.minimum(nxt, place.size - 1)] - 1, top)
        out = self._band(idx[pos], 2 * place, 2 * place, np.maximum(hi, 2 * place + 1),
                         2 * place + 1, [w[pos] for w in weights], [fail[p] for p in pos])
        out["order"] = "the server's log order; later moments between it and the send times"
        return out

    def _band(self, idx: np.ndarray, s: np.ndarray, f: np.ndarray, fin: np.ndarray | None,
              fin_lo: np.ndarray | None, weights: list[np.ndarray], fail: list[bool],
              after: str | None = None, budget: int = SEARCH_BUDGET) -> dict:
        capacity = self.target.capacity(self.capacity)
        cols = RequestColumns.of(self.requests)
        res = order_band(self.target, cols.items.take(idx), cols.images[idx].tolist(),
                         capacity, s, f, fin, weights, lambda: self.new_cache(capacity),
                         fail, budget=budget, fin_lo=fin_lo, after=after)
        return _band_out(res.bounds, res.method)


class _Rows:
    """The records the prediction reads, as a table's columns by dispatch index (a million
    requests never become a million objects)."""

    def __init__(self, table: RecordTable, n: int) -> None:
        di = table.dispatch_index
        valid = (di != NONE) & (di >= 0) & (di < n)
        self.table, self.row = table, np.full(n, -1, np.int64)
        self.row[di[valid]] = np.flatnonzero(valid)
        self.present = self.row >= 0

    def col(self, name: str, idx: np.ndarray) -> np.ndarray:
        """Column ``name`` of the requests (dispatch indices) ``idx``."""
        return self.table.cols[name][self.row[idx]]

    def failed(self, idx: np.ndarray) -> np.ndarray:
        return ~np.equal(self.col("error", idx), None)  # type: ignore[call-overload]

    def tokened(self, idx: np.ndarray) -> np.ndarray:
        return self.col("first_token_ns", idx) != NONE


class _Times:
    """The client's times of the processed requests ``idx`` (send order), as the band needs
    them (``later``: their later moments, where the target has them)."""

    def __init__(self, rows: _Rows, idx: np.ndarray, slack: np.ndarray,
                 later: np.ndarray | None) -> None:
        self.slack = slack
        self.start = rows.col("start_ns", idx)
        self.reply = _first_byte(rows, idx)
        first = rows.col("first_token_ns", idx)
        self.first = np.where(first != NONE, first, -1)
        self.fin = None if later is None else np.where(later != NONE, later, self.reply)


def _sorted_events(order: np.ndarray, kind: np.ndarray, req: np.ndarray) -> Events:
    """The events' kinds and requests by ``order``, then kind, then request."""
    by = np.lexsort((req, kind, order))
    return kind[by], req[by]


def _fcfs_keys(rows: _Rows, idx: np.ndarray) -> np.ndarray | None:
    """Where each processed request's lookups go in a first-come-first-served engine's order
    (``band.fcfs_windows``): its first token; a request without one (an engine fault, an empty
    reply) just after the latest-sent request with one sent before it. None when no request
    streamed a first token (the order is then the send order)."""
    start, first = rows.col("start_ns", idx), rows.col("first_token_ns", idx)
    has = first != NONE
    if not has.any():
        return None
    by = np.lexsort((first[has], start[has]))  # (sent, first token) ascending
    sent, tok = start[has][by], first[has][by]
    k = np.searchsorted(sent, start, side="left") - 1
    before = np.where(k >= 0, tok[np.maximum(k, 0)], tok.min() - 1)
    return np.where(has, first, before)


def _first_byte(rows: _Rows, idx: np.ndarray) -> np.ndarray:
    """The latest moment the server can have taken each request in: the first byte the client
    saw of its reply (first token, else the end of the reply)."""
    top = np.iinfo(np.int64).max
    times = [rows.col(c, idx) for c in ("first_token_ns", "response_end_ns", "end_ns")]
    seen = np.minimum.reduce([np.where(t != NONE, t, top) for t in times])
    return np.where(seen != top, seen, top // 2)


def _known_band(exact: tuple[int, int], how: str) -> dict:
    return _band_out([(exact[0], exact[0]), (exact[1], exact[1])], how)


def _band_out(bounds: Sequence[tuple[int, int]], method: str) -> dict:
    """The export's band from (low, high) over the profiling requests, then over all."""
    (low, high), (low_all, high_all) = bounds
    return {"low": low, "high": high, "width": high - low, "method": method,
            "measured_inside": None, "all_requests": {"low": low_all, "high": high_all}}


def _family(target: CacheTarget) -> str | None:
    """The scraped counter family that reports ``target`` (``scrape.counter_delta``'s
    source), to compare the band with."""
    from .scrape import FAMILY_OF

    return FAMILY_OF.get((target.metrics or {}).get("hits", ""))


def prediction_setup(model_name: str, cache: Any, geometry: Any, encoder: Any,
                     embedded: Any = None) -> tuple[ImageTracker | None, str | None]:
    """The tracker for a bench run of ``model_name`` (``cache``: the run's
    ``settings.cache.BenchCache``, ``geometry``: its ``Geometry``), or why there is none; what
    a server of the user's runs. ``embedded``: the embedded simulator's settings
    (``settings.sim.Simulator``), whose cache is its profile's running the asked target, sized
    and keyed as the simulator runs it (``--sim-arg`` included: the capacity, budget and
    geometry the server has); a model outside the registry needs its geometry (a local folder
    or flags): the run goes on, but says so on stderr at once."""
    import sys

    from ..caches import get_target
    from ..vlm import resolve_model

    if embedded:  # what the cache runs with: the simulator's settings (--sim-arg included)
        cache, geometry = embedded.cache, embedded.geometry
    values, model_path = geometry.values(), geometry.model_path
    batched, front = DEFAULT_BATCHED_TOKENS, cache.encoder_budget
    try:
        if embedded:  # the simulator's own profile, its --sim-arg overrides included
            from ..sim.study import load_engine_profile

            prof = load_engine_profile(embedded.engine, embedded.cache)
            target = prof.cache_target()
            model = resolve_model(prof.model, model_path, **values)
            batched, front = prof.token_budget, prof.encoder_budget
        else:
            target = get_target(cache.target_name)
            model = resolve_model(model_name, model_path, **values)
    except UserError as exc:
        note = f"no cache prediction: {exc}"
        print(f"warning: {note} (or --no-predict)", file=sys.stderr)
        return None, note
    capacity = target.resolve(cache.cache_size)
    front = front_budget(target, model, front, batched)
    return ImageTracker(model, target, capacity, encoder, front), None


def prediction_result(tracker: ImageTracker | None, note: str | None, table: RecordTable,
                      started: int, timeline: dict | None,
                      slack_ns: np.ndarray | None = None, band_later: bool = False
                      ) -> dict | None:
    """The export's ``predicted`` block (per-request predictions go into the table's
    ``predicted_hits``; ``band_later``: see ``ImageTracker.predict``)."""
    if tracker is None:
        return {"note": note} if note else None
    di = table.dispatch_index
    dispatched = di != NONE
    mask = np.zeros(started, bool)
    mask[di[dispatched & (table.phase == "profiling")]] = True
    try:
        pred = tracker.predict(table, mask, timeline, slack_ns, band_later)
    except UserError as exc:
        return {"note": f"prediction failed: {exc}"}
    per_req = pred.pop("per_request_hits", None)
    if per_req is not None:
        has = dispatched & (di < per_req.size)
        table.predicted_hits[has] = per_req[di[has]]
    t = tracker.target
    pred.update(model=tracker.model.name, geometry=tracker.model.geometry(), cache=t.name,
                capacity=tracker.capacity, unit=t.unit, keying=t.key, engine=t.engine)
    if t.unit == "GiB":
        pred["cache_gb"] = tracker.capacity
    notes = [tracker.order_note] if tracker.order_note else []
    if tracker.undecodable:
        notes.append(f"{tracker.undecodable} images undecodable; sized as "
                     f"{DEFAULT_URL_SIZE[0]}x{DEFAULT_URL_SIZE[1]}")
    if notes:
        pred["note"] = "; ".join(notes)
    return pred


def settle_band(pred: dict | None) -> dict | None:
    """``pred`` with its band made, where the prediction left it for later (``band_later``)."""
    if pred is not None and callable(pred.get("band")):
        try:
            pred["band"] = pred["band"]()
        except UserError as exc:
            pred["band"] = {"note": f"no band: {exc}"}
    return pred


CACHE_ITEMS_NAME = "cache_items.jsonl"


def item_key(key: Any) -> str:
    """A cache key as one short string, equal for equal keys in every process (merge-runs joins
    the items of several workers)."""
    import blake3

    return blake3.blake3(repr(key).encode()).hexdigest()[:32]


def cache_item_lines(tracker: ImageTracker, records: list) -> Iterator[bytes]:
    """``cache_items.jsonl`` of a sharded worker: a header (the cache, its size in its own
    unit, the front tier, the model's bytes per token), then each dispatched request's items
    (key, size) and image count, by dispatch index, with its X-Request-ID and, from the
    simulator, its cache events (the server's order)."""
    import orjson

    t = tracker.target
    yield orjson.dumps({"target": t.name, "cache_size": tracker.capacity,
                        "front": tracker.front, "bytes_per_token": tracker.model.bytes_per_token,
                        "model": tracker.model.name}) + b"\n"
    xid = {r.dispatch_index: r.x_request_id for r in records if r.dispatch_index is not None}
    for i, req in enumerate(tracker.requests):
        yield orjson.dumps({"dispatch_index": i, "x_request_id": xid.get(i),
                            "images": req.images,
                            "items": [[item_key(k), s] for k, s in req.items],
                            "seqs": (tracker.timeline or {}).get(xid.get(i))}) + b"\n"


REQUEST_ID = re.compile(rb"[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}")
LOG_CHUNK = 8 << 20


class ServerLogScan:
    """The order in which a server's log first names each of ``expected`` (X-Request-IDs,
    uuid4 strings): vLLM with ``--enable-log-requests`` logs "Received request
    chatcmpl-<X-Request-ID>" once it has processed a request's inputs, i.e. in the order its
    caches saw them. ``more()`` reads what the log gained since the last call, in chunks (a
    long server's log is large, and is read once); ids of other runs are ignored."""

    KEEP = 40  # an id cut by a chunk boundary is found with the next chunk

    def __init__(self, path: Any, expected: set[str]) -> None:
        self.path, self.expected = path, expected
        self.order: dict[str, int] = {}
        self.offset, self.tail = 0, b""

    def more(self) -> dict[str, int]:
        with open(self.path, "rb") as fh:
            fh.seek(self.offset)
            while chunk := fh.read(LOG_CHUNK):
                self.offset += len(chunk)
                buf = self.tail + chunk
                for m in REQUEST_ID.finditer(buf):
                    xid = m.group().decode()
                    if xid in self.expected and xid not in self.order:
                        self.order[xid] = len(self.order)
                self.tail = buf[-self.KEEP:]
        return self.order


async def read_server_order(path: Any, expected: set[str], timeout: float = 5.0
                            ) -> tuple[dict[str, int] | None, str | None]:
    """``ServerLogScan``, waiting briefly until every expected request is in the log (a server
    writes its log lines asynchronously); (order, None), or (None, why not)."""
    import asyncio

    scan = ServerLogScan(path, expected)
    deadline = asyncio.get_running_loop().time() + timeout
    while True:
        try:
            order = scan.more()
        except OSError as exc:
            return None, f"server log {path} unreadable ({exc.strerror or exc})"
        if expected <= order.keys():
            return order, None
        if asyncio.get_running_loop().time() > deadline:
            return None, (f"the server log names {len(order):,} of the {len(expected):,} "
                          "requests (run the server with request logging, e.g. vLLM's "
                          "--enable-log-requests): first-token order used")
        await asyncio.sleep(0.1)


async def fetch_timeline(url: str, expected: set[str], timeout: float = 5.0) -> dict | None:
    """The simulator's cache timeline (None from any other server). Waits briefly until every
    expected request is in it (a handler records its request as it finishes)."""
    import asyncio

    import aiohttp

    deadline = asyncio.get_running_loop().time() + timeout
    try:
        async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=timeout)) as s:
            while True:
                async with s.get(url.rstrip("/") + TIMELINE_PATH) as resp:
                    if resp.status != 200:
                        return None
                    events = (await resp.json()).get("events") or {}
                if expected <= events.keys() or asyncio.get_running_loop().time() > deadline:
                    return events
                await asyncio.sleep(0.05)
    except (TimeoutError, aiohttp.ClientError, ValueError):
        return None


async def observe_order(tracker: ImageTracker, url: str, records: Sequence[Any],
                        server_log: Any = None) -> dict | None:
    """What the server tells of the order it saw a finished run's requests in, kept on the
    tracker: the simulator's cache timeline at ``url`` (exact; returned), else the places its
    log (``server_log``) gives the requests it processed, or why it could not."""
    timeline = await fetch_timeline(url, {r.x_request_id for r in records if r.ok})
    tracker.timeline = timeline
    if timeline is None and server_log is not None:
        from ..outcomes import engine_processed

        tracker.server_order, tracker.order_note = await read_server_order(
            server_log, {r.x_request_id for r in records if engine_processed(r)})
    return timeline
