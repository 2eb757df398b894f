"""``sweep --search rate``: the highest request rate whose runs meet the SLOs.

A *probe* is one sweep point at a request rate, run ``--repeats`` times like any point (its
folder, exports, resume). A run's *SLO attainment* is the share of its profiling requests that
are good: they succeeded and met every ``--goodput`` objective (the goodput definition of vLLM
and AIPerf, :mod:`mmdatagen.loadgen.goodput`; a failed request is never good). A probe passes
when the mean attainment over its repeats is at least ``--slo-attainment`` (default 0.9).

The search (vLLM's ``bench sweep serve_sla`` tunes a rate against SLAs the same way): probe
``--search-min``; then ``--search-max``, or without one double the rate until a probe fails;
then bisect geometrically (the next rate is the geometric mean of the highest passing and the
lowest failing rate, 6 significant digits) until the lowest failing rate is at most
``1 + --search-precision`` times the highest passing one. The result is the highest passing
rate: when passing is monotone in the rate, the largest rate meeting the SLOs lies in
[result, lowest failing). It works wherever a sweep does: the embedded simulator, ``--url``,
and ``--virtual`` (virtual time: seconds per probe).

Each probe prints its rate, pass or fail, the attainment against the target and, per SLO, the
metric at the attainment's quantile (p90 of TTFT for 0.9; p10 for a larger-is-better metric)
against its objective. ``sweep.json`` holds the probes and the result under ``search``;
``search.csv`` one row per probe.
"""
from __future__ import annotations

import csv
import io
import math
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from ..errors import SpecError
from ..metrics import RECORD_METRICS, RECORDS_NAME, metric_columns
from .goodput import LARGER_IS_BETTER

if TYPE_CHECKING:
    from ..exportmodel import GridValue, SweepDoc, SweepPoint
    from ..settings.run import BenchRun
    from ..settings.sweep import SweepSearch

SEARCH_CSV = "search.csv"
RATE_LIMIT = 1e6  # requests/s: the doubling stops here (the rate options' maximum)
SHORT = {"time_to_first_token": "ttft", "inter_token_latency": "itl",
         "request_latency": "e2el", "output_token_throughput_per_user": "tps_per_user"}


def round_rate(rate: float) -> float:
    """A probed rate: 6 significant digits (stable folder names, far below any precision)."""
    return float(f"{rate:.6g}")


def bisect_rate(passes: Callable[[float], bool], lo: float, hi: float | None,
                precision: float, limit: float = RATE_LIMIT) -> tuple[float | None, float | None]:
    """(highest passing rate, lowest failing rate) found by probing ``passes``: ``lo`` first,
    then ``hi`` (or doubling up to ``limit`` when None), then geometric bisection until
    failing / passing <= 1 + precision. None: no rate passed / none failed."""
    if not passes(lo):
        return None, lo
    passing, failing = lo, None
    if hi is not None:
        if hi <= lo or passes(hi):
            return max(lo, hi), None
        failing = hi
    while failing is None:
        if passing >= limit:
            return passing, None
        rate = round_rate(min(passing * 2, limit))
        if passes(rate):
            passing = rate
        else:
            failing = rate
    while failing / passing > 1 + precision:
        mid = round_rate(math.sqrt(passing * failing))
        if not passing < mid < failing:
            break  # the rounding's resolution is reached
        if passes(mid):
            passing = mid
        else:
            failing = mid
    return passing, failing


def quantile_name(tag: str, attainment: float) -> str:
    """The percentile of ``tag`` that the attainment target speaks of (p90 for 0.9; p10 of a
    larger-is-better metric)."""
    q = (1 - attainment) if tag in LARGER_IS_BETTER else attainment
    return f"p{q * 100:.4g}"


def run_attainment(run: dict[str, Any]) -> float | None:
    """The share of a run's profiling requests that were good (None without goodput)."""
    good, ok, failed = run.get("good_request_count"), run.get("request_count"), \
        run.get("error_count")
    total = (ok or 0) + (failed or 0)
    return None if good is None or not total else good / total


def slo_values(run_dir: Path, slos: dict[str, float], attainment: float
               ) -> dict[str, float | None]:
    """Per SLO, its metric at the attainment's quantile over a run's successful profiling
    requests (from its records.jsonl)."""
    from ..export import read_records

    path = Path(run_dir) / RECORDS_NAME
    if not path.is_file():
        return dict.fromkeys(slos)
    t = read_records(path)
    cols = metric_columns(t.take(t.phase_is("profiling") & t.ok))
    out: dict[str, float | None] = {}
    for tag in slos:
        v = cols[tag][~np.isnan(cols[tag])]
        q = (1 - attainment) if tag in LARGER_IS_BETTER else attainment
        out[tag] = float(np.percentile(v, 100 * q)) if v.size else None
    return out


@dataclass
class Probe:
    """One probed rate: the decision and what it was made from."""

    rate: float
    attainments: list[float | None]
    target: float
    slos: dict[str, float]
    slo_metrics: dict[str, float | None] = field(default_factory=dict)  # mean over repeats
    point: str = ""

    @property
    def attainment(self) -> float | None:
        vals = [a for a in self.attainments if a is not None]
        return float(np.mean(vals)) if vals else None

    @property
    def passed(self) -> bool:
        a = self.attainment
        return a is not None and a >= self.target

    def doc(self, index: int) -> dict[str, Any]:
        return {"probe": index, "request_rate": self.rate, "passed": self.passed,
                "attainment": self.attainment, "attainments": self.attainments,
                "point": self.point,
                "slo_metrics": {tag: {"quantile": quantile_name(tag, self.target),
                                      "value": self.slo_metrics.get(tag), "objective": obj}
                                for tag, obj in self.slos.items()}}

    def line(self, index: int) -> str:
        a = self.attainment
        parts = [f"probe {index}: {self.rate:g} req/s {'PASS' if self.passed else 'FAIL'}",
                 f"attainment {'-' if a is None else f'{a:.3f}'} "
                 f"{'>=' if self.passed else '<'} {self.target:g}"]
        if len(self.attainments) > 1:
            parts[-1] += " (repeats " + ", ".join("-" if x is None else f"{x:.3f}"
                                                  for x in self.attainments) + ")"
        for tag, obj in self.slos.items():
            v = self.slo_metrics.get(tag)
            ok = v is not None and ((v >= obj) if tag in LARGER_IS_BETTER else (v <= obj))
            parts.append(f"{SHORT.get(tag, tag)} {quantile_name(tag, self.target)} "
                         f"{'-' if v is None else f'{v:.4g}'} {'meets' if ok else 'misses'} "
                         f"{obj:g} {_unit(tag)}")
        return "; ".join(parts)


def evaluate(point: SweepPoint, rate: float, slos: dict[str, float], target: float) -> Probe:
    """A probe's verdict from its point's runs."""
    runs = point["runs"]
    per_run = [slo_values(Path(r["dir"]), slos, target) for r in runs]
    metrics: dict[str, float | None] = {}
    for tag in slos:
        vals = [v for m in per_run if (v := m[tag]) is not None]
        metrics[tag] = float(np.mean(vals)) if vals else None
    return Probe(rate, [run_attainment(r) for r in runs], target, slos, metrics, point["name"])


def check_search(s: SweepSearch, base: BenchRun, grid: dict[str, list[GridValue]]) -> None:
    """What a rate search needs from the sweep's settings."""
    if not base.slos:
        raise SpecError("search", "needs `goodput`: the SLOs a rate must meet")
    if "request_rate" in grid:
        raise SpecError("search", "sets the request rate itself: give no `request_rate`")
    many = next((axis for axis, values in grid.items() if len(values) > 1), None)
    if many is not None:
        raise SpecError("search", f"probes one point per rate: give one value of {many}")
    if base.load.ramp_to is not None:
        raise SpecError("search", "varies the rate itself: it takes no `ramp_to`")
    if s.search_max is not None and s.search_max <= s.search_min:
        raise SpecError("search_max", "must be above `search_min`")


def run_search(s: SweepSearch, slos: dict[str, float], grid: dict[str, list[GridValue]],
               point: Callable[[dict[str, Any]], SweepPoint], log: Callable[[str], None]
               ) -> tuple[list[SweepPoint], dict[str, list[GridValue]], dict[str, Any]]:
    """Run the search (``point`` runs one sweep point's repeats): the probes' points (by
    rate), the grid they make and the ``search`` block of ``sweep.json``."""
    fixed = {axis: values[0] for axis, values in grid.items()}
    probes: list[Probe] = []
    points: list[SweepPoint] = []

    def passes(rate: float) -> bool:
        pt = point({**fixed, "request_rate": rate})
        points.append(pt)
        probes.append(evaluate(pt, rate, slos, s.slo_attainment))
        log(probes[-1].line(len(probes)))
        return probes[-1].passed

    passing, failing = bisect_rate(passes, round_rate(s.search_min),
                                   None if s.search_max is None else round_rate(s.search_max),
                                   s.search_precision)
    rates = [p.rate for p in probes]
    by_rate = [pt for _, pt in sorted(zip(rates, points), key=lambda x: x[0])]
    search = {
        "variable": "request_rate", "unit": "requests/s", "slos": slos,
        "slo_attainment": s.slo_attainment, "precision": s.search_precision,
        "bounds": [s.search_min, s.search_max],
        "decision": "a probe passes when the mean over its repeats of the share of good "
                    "profiling requests (succeeded, every SLO met) is at least slo_attainment",
        "probes": [p.doc(i) for i, p in enumerate(probes, 1)],
        "result": {"request_rate": passing, "lowest_failing": failing,
                   "statement": result_statement(passing, failing, s.search_precision)}}
    return by_rate, {**{axis: [v] for axis, v in fixed.items()}, "request_rate": sorted(rates)}, \
        search


def result_statement(passing: float | None, failing: float | None, precision: float) -> str:
    if passing is None:
        return (f"no rate meets the SLOs: the lowest probed, {failing:g} req/s, misses them")
    if failing is None:
        return (f"every rate probed meets the SLOs, up to {passing:g} req/s (the upper bound "
                "of the search)")
    return (f"highest rate meeting the SLOs: {passing:g} req/s; {failing:g} req/s misses them "
            f"(precision {precision:g}: the limit lies in between, "
            f"{failing / passing - 1:.1%} apart)")


def search_summary(doc: SweepDoc) -> str:
    """The probes and the result, for the console."""
    search = doc.get("search") or {}
    lines = [f"search: {len(search['probes'])} probes of {doc['repeats']} run"
             f"{'s' if doc['repeats'] != 1 else ''} each; SLOs "
             + ", ".join(f"{SHORT.get(k, k)} {v:g}" for k, v in search["slos"].items())
             + f", attainment >= {search['slo_attainment']:g}"]
    lines += [_probe_line(p) for p in search["probes"]]
    lines.append(search["result"]["statement"])
    return "\n".join(lines)


def _probe_line(p: dict[str, Any]) -> str:
    a = p["attainment"]
    metrics = "; ".join(
        f"{SHORT.get(tag, tag)} {m['quantile']} "
        f"{'-' if m['value'] is None else format(m['value'], '.4g')} {_unit(tag)} "
        f"(SLO {m['objective']:g})" for tag, m in p["slo_metrics"].items())
    return (f"  {p['probe']:>2}. {p['request_rate']:>10g} req/s  "
            f"{'PASS' if p['passed'] else 'FAIL'}  attainment "
            f"{'-' if a is None else f'{a:.3f}'}  {metrics}")


def _unit(tag: str) -> str:
    return RECORD_METRICS[tag][0]


def search_csv(doc: SweepDoc) -> str:
    """``search.csv``: one row per probe."""
    search = doc.get("search") or {}
    slos = list(search["slos"])
    buf = io.StringIO()
    w = csv.writer(buf, lineterminator="\n")
    w.writerow(["probe", "request_rate", "passed", "attainment",
                *[f"{SHORT.get(t, t)}_at_quantile" for t in slos],
                *[f"{SHORT.get(t, t)}_slo" for t in slos], "point"])
    for p in search["probes"]:
        m = p["slo_metrics"]
        w.writerow([p["probe"], p["request_rate"], p["passed"],
                    "" if p["attainment"] is None else p["attainment"],
                    *["" if m[t]["value"] is None else m[t]["value"] for t in slos],
                    *[m[t]["objective"] for t in slos], p["point"]])
    return buf.getvalue()
