"""Per-request records -> the small aggregates a report draws (kept in the export).

Reports never embed every record: a run of any size becomes

- ``distributions``: quantiles of TTFT, ITL and request latency at 201 evenly spaced levels
  (enough for a CDF drawn at screen resolution), and
- ``timeline``: at most :data:`MAX_BINS` time bins from the first profiling request: requests in
  flight (mean over the bin), completions and output tokens per second, and per bin the image
  cache hits measured (response headers) and predicted (the loader's LRU replay), by request start.

Everything is vectorised with numpy (100k records take well under a second).
"""
from __future__ import annotations

from typing import Any

import numpy as np

from ..metrics import NONE, Records, RecordTable, as_table, metric_columns, response_ends

MAX_BINS = 120
LEVELS = np.linspace(0.0, 100.0, 201)
DIST_TAGS = ("time_to_first_token", "inter_token_latency", "request_latency")
_NICE = (0.001, 0.002, 0.005, 0.01, 0.02, 0.05, 0.1, 0.2, 0.25, 0.5, 1, 2, 5, 10, 15, 30, 60, 120,
         300, 600, 900, 1800, 3600)


class Columns:
    """The per-request fields aggregates need, as numpy arrays (profiling requests only; -1
    where a field is missing). Metric values are :func:`mmdatagen.metrics.metric_columns`."""

    def __init__(self, t: RecordTable) -> None:
        t = t.take(t.phase_is("profiling"))

        def col(name: str, values: np.ndarray | None = None) -> np.ndarray:
            v = t.cols[name] if values is None else values
            return np.where(v == NONE, -1, v)

        self.start, self.first, self.end = t.start_ns, col("first_token_ns"), col("end_ns")
        self.resp_end = col("response_end_ns", response_ends(t))
        self.out_tokens, self.ok, self.streaming = t.output_tokens, t.ok, t.streaming
        measured = (t.image_hits != NONE) & (t.image_misses != NONE)
        self.hits = np.where(measured, t.image_hits, -1)
        self.misses = np.where(measured, t.image_misses, -1)
        self.pred = col("predicted_hits")
        cols = metric_columns(t)
        self.values = {tag: cols[tag] for tag in DIST_TAGS}

    @classmethod
    def from_records(cls, records: Records) -> Columns:
        return cls(as_table(records))


def nice_bin(span_s: float, max_bins: int = MAX_BINS) -> float:
    """The smallest round bin width giving at most ``max_bins`` bins over ``span_s``."""
    for w in _NICE:
        if span_s / w <= max_bins:
            return float(w)
    return float(np.ceil(span_s / max_bins))


def distributions(c: Columns) -> dict[str, Any]:
    out: dict[str, Any] = {"levels_pct": [float(x) for x in LEVELS]}
    for tag in DIST_TAGS:
        v = c.values[tag]
        v = v[~np.isnan(v)]
        # sorted first: the same order statistics (so the same quantiles), found faster
        out[tag] = ([round(float(x), 4) for x in np.percentile(np.sort(v), LEVELS)]
                    if v.size else None)
    return out


def _emitted_by(edges: np.ndarray, t0: np.ndarray, t1: np.ndarray, amount: np.ndarray) -> np.ndarray:
    """Sum over requests of ``amount`` spread evenly over [t0, t1], emitted by each edge time."""
    dur = np.maximum(t1 - t0, 1e-12)
    rate = amount / dur
    o0 = np.argsort(t0)
    s0, r0 = t0[o0], rate[o0]
    cr0, crt0 = np.r_[0.0, np.cumsum(r0)], np.r_[0.0, np.cumsum(r0 * s0)]
    o1 = np.argsort(t1)
    s1, r1 = t1[o1], rate[o1]
    cr1, crt1 = np.r_[0.0, np.cumsum(r1)], np.r_[0.0, np.cumsum(r1 * s1)]
    k0 = np.searchsorted(s0, edges, side="right")
    k1 = np.searchsorted(s1, edges, side="right")
    return (edges * cr0[k0] - crt0[k0]) - (edges * cr1[k1] - crt1[k1])


def timeline(c: Columns, max_bins: int = MAX_BINS) -> dict[str, Any] | None:
    if c.start.size == 0:
        return None
    base = int(c.start.min())
    start = (c.start - base) / 1e9
    end_ns = np.where(c.resp_end >= 0, c.resp_end, c.start)
    end = (end_ns - base) / 1e9
    span = float(end.max()) if end.size else 0.0
    width = nice_bin(max(span, 1e-3), max_bins)
    n = max(1, int(np.ceil(span / width + 1e-9)))
    edges = np.arange(n + 1) * width
    # requests in flight: mean over the bin, from 8 sub-samples
    sub = (edges[:-1, None] + (np.arange(8) + 0.5)[None, :] * (width / 8)).ravel()
    s_sorted, e_sorted = np.sort(start), np.sort(end)
    inflight = (np.searchsorted(s_sorted, sub, side="right")
                - np.searchsorted(e_sorted, sub, side="right")).reshape(n, 8).mean(axis=1)
    done = np.histogram(end[c.ok], bins=edges)[0]
    ok = c.ok & (c.first >= 0)
    tok_t0 = np.where(ok, (c.first - base) / 1e9, end)
    tok_t1 = np.where(c.end >= 0, (c.end - base) / 1e9, end)
    emitted = _emitted_by(edges, tok_t0[c.ok], np.maximum(tok_t1[c.ok], tok_t0[c.ok]),
                          c.out_tokens[c.ok].astype(np.float64))
    tokens_per_s = np.diff(emitted) / width
    out: dict[str, Any] = {
        "bin_s": width, "t_s": [round(float(x), 6) for x in edges[:-1]],
        "in_flight": [round(float(x), 3) for x in inflight],
        "completed_per_s": [round(float(x) / width, 4) for x in done],
        "output_tokens_per_s": [round(float(x), 3) for x in tokens_per_s],
    }
    meas = c.hits >= 0
    if meas.any():
        h = np.histogram(start[meas], bins=edges, weights=c.hits[meas])[0]
        m = np.histogram(start[meas], bins=edges, weights=c.misses[meas])[0]
        out["hits"] = [int(x) for x in h]
        out["misses"] = [int(x) for x in m]
    pred = c.pred >= 0
    if pred.any():
        out["predicted_hits"] = [int(x) for x in np.histogram(start[pred], bins=edges,
                                                                 weights=c.pred[pred])[0]]
        if meas.any():
            refs = np.where(meas & pred, c.hits + c.misses, 0)
            out["references"] = [int(x) for x in np.histogram(start, bins=edges, weights=refs)[0]]
    return out


def aggregates(c: Columns) -> dict[str, Any]:
    return {"distributions": distributions(c), "timeline": timeline(c)}


def run_aggregates(records: Records) -> dict[str, Any]:
    """The export's ``distributions`` and ``timeline`` blocks from in-memory records (a list
    or a table)."""
    return aggregates(Columns.from_records(records))


def aggregates_from_records_file(path) -> dict[str, Any] | None:
    """Aggregates from a ``records.jsonl`` (for exports written without them); None if absent."""
    from pathlib import Path

    from ..export import read_records

    path = Path(path)
    if not path.is_file():
        return None
    return aggregates(Columns(read_records(path)))
