"""What a request's outcome says about the engine, one rule for every reader of records.

- :func:`engine_processed`: did the engine take the request in (preprocess its media, so look
  its items up in its caches)? A cache prediction counts exactly these requests, in ``bench``
  and in ``merge-runs`` alike (``engine_processed_rows``: the same rule over a table's
  columns).
- :func:`engine_faults`: the requests the engine failed after taking them in (a 5xx, or an
  error object inside a 200 response), as their own class: how many, which statuses, the first
  message, and the engine bugs recognised by their message (:data:`KNOWN_FAULTS`).
"""
from __future__ import annotations

from collections import Counter
from collections.abc import Iterable
from typing import TYPE_CHECKING, Any

import numpy as np

if TYPE_CHECKING:
    from .metrics import RequestRecord

#: 5xx statuses that say the request never reached an engine: a gateway's (bad gateway,
#: gateway timeout) or a server with no engine to give it to (service unavailable)
REFUSED_5XX = frozenset({502, 503, 504})

#: (kind, name, text its message contains, what it is)
KNOWN_FAULTS: tuple[tuple[str, str, str, str], ...] = (
    ("vllm-mm-cache-mirror", "vLLM processor-cache mirror bug",
     "Expected a cached item for mm_hash",
     "the API server's mirror of the processor cache believed an item cached that the "
     "engine core had evicted (seen when one request's images exceed the cache)"),
)


def engine_processed(r: RequestRecord) -> bool:
    """Whether the engine processed ``r``: it answered 2xx (content or not: an empty reply, an
    error object in the stream, a body cut short), or a 5xx other than :data:`REFUSED_5XX`
    (a failure after preprocessing). Not processed: no response at all (connection refused,
    reset or timed out before the status line, cancelled, the loader's own failures), a 4xx
    (validation refused it before any cache) or a refusing 5xx."""
    if r.error is None or r.first_token_ns is not None:
        return True
    status = r.http_status
    if status is None:
        return False
    if 200 <= status < 300:
        return True
    return 500 <= status < 600 and status not in REFUSED_5XX


def engine_processed_rows(failed: np.ndarray, tokened: np.ndarray, status: np.ndarray
                          ) -> np.ndarray:
    """:func:`engine_processed` over columns: ``failed`` (an error), ``tokened`` (a first
    token), ``status`` (the HTTP status; a missing one is any value outside 200-599, as
    ``metrics.NONE``)."""
    answered = (status >= 200) & (status < 300)
    after = (status >= 500) & (status < 600) & ~np.isin(status, sorted(REFUSED_5XX))
    return ~failed | tokened | answered | after


def is_engine_fault(r: RequestRecord) -> bool:
    """A request the server failed: an HTTP 5xx, or an error object inside a 200 reply."""
    if r.error is None:
        return False
    status = r.http_status or 0
    return status >= 500 or r.error.get("type") == "ServerError"


def known_fault(message: str | None) -> str | None:
    """The kind of a recognised engine bug whose message this is, else None."""
    for kind, _, needle, _ in KNOWN_FAULTS:
        if message and needle in message:
            return kind
    return None


def fault_name(kind: str) -> str:
    return next((name for k, name, _, _ in KNOWN_FAULTS if k == kind), kind)


def engine_faults(records: Iterable[RequestRecord]) -> dict[str, Any]:
    """The export's ``engine_faults`` block over ``records`` (every phase): ``count``,
    ``statuses`` (status -> count, as strings), ``first_message`` (the earliest fault's, by
    start time) and ``known`` (kind -> count)."""
    faults = sorted((r for r in records if is_engine_fault(r)), key=lambda r: r.start_ns)
    statuses: Counter[str] = Counter(str(r.http_status) for r in faults)
    known: Counter[str] = Counter()
    for r in faults:
        kind = known_fault(r.error["message"] if r.error else None)
        if kind is not None:
            known[kind] += 1
    return {"count": len(faults), "statuses": dict(statuses),
            "first_message": faults[0].error["message"] if faults and faults[0].error else None,
            "known": dict(known)}


def fault_lines(block: dict[str, Any] | None) -> list[str]:
    """Console lines for an ``engine_faults`` block (none when there was no fault)."""
    if not block or not block.get("count"):
        return []
    statuses = ", ".join(f"HTTP {s} x{n:,}" for s, n in sorted(block["statuses"].items()))
    lines = [f"Engine faults: {block['count']:,} requests failed inside the engine ({statuses}); "
             f"first: {(block.get('first_message') or '')[:160]}"]
    for kind, n in sorted((block.get("known") or {}).items()):
        what = next((w for k, _, _, w in KNOWN_FAULTS if k == kind), "")
        lines.append(f"Known engine bug x{n:,}: {fault_name(kind)} ({kind}): {what}. These "
                     "requests still count in the cache prediction, up to the item that failed "
                     "(the engine looked those up).")
    return lines
