"""The A/B table in the seeds' shape: Metric | A | B | Delta % (Delta = (A - B) / B).

Reads our ``profile_export_mmdatagen.json`` or AIPerf's ``profile_export_aiperf.json`` (same
top-level metric blocks), so runs of either tool can be compared.
"""
from __future__ import annotations

from pathlib import Path
from typing import Any

import orjson

from ..errors import UserError
from ..metrics import EXPORT_NAME

EXPORT_CANDIDATES = (EXPORT_NAME, "profile_export_aiperf.json")

# label, metric tag, statistic
ROWS: tuple[tuple[str, str, str], ...] = (
    ("Output TPS (tok/s)", "output_token_throughput", "avg"),
    ("TTFT avg (ms)", "time_to_first_token", "avg"),
    ("TTFT p50 (ms)", "time_to_first_token", "p50"),
    ("TTFT p99 (ms)", "time_to_first_token", "p99"),
    ("ITL avg (ms)", "inter_token_latency", "avg"),
    ("Request latency avg (ms)", "request_latency", "avg"),
    ("Request throughput (req/s)", "request_throughput", "avg"),
)


def find_export(path: Path) -> Path:
    """A run folder (or an export file) -> its export JSON."""
    path = Path(path)
    if path.is_file():
        return path
    if path.is_dir():
        for name in EXPORT_CANDIDATES:
            if (path / name).is_file():
                return path / name
        hits = sorted(path.glob("**/profile_export_*.json"))
        if hits:
            return hits[0]
        raise UserError(f"no profile export JSON in {path}")
    raise UserError(f"not found: {path}")


def load_export(path: Path) -> dict[str, Any]:
    f = find_export(path)
    try:
        doc = orjson.loads(f.read_bytes())
    except (OSError, orjson.JSONDecodeError) as exc:
        raise UserError(f"cannot read {f}: {exc}") from None
    problem = export_problem(doc)
    if problem is not None:
        raise UserError(f"{f} is not a usable export: {problem}")
    return doc


# The blocks of an export that compare and the report read, by shape (checked before use).
SERIES_BLOCKS = ("timeline", "distributions", "server_metrics_timeseries")
OBJECT_BLOCKS = ("input_config", "run_info", "image_cache", "warmup_metrics")
LIST_BLOCKS = ("error_summary", "warmup_error_summary")


def export_problem(doc: Any) -> str | None:
    """Why ``doc`` (an export read from outside: ours, AIPerf's, or edited) cannot be used, or
    None: every block compare and the report read has its shape (statistics are numbers,
    series are lists of numbers, objects are objects). Unknown keys are left alone."""
    if not isinstance(doc, dict):
        return "not a JSON object"
    for key, value in doc.items():
        if value is None:
            continue
        problem = _block_problem(key, value)
        if problem is not None:
            return f"'{key}' {problem}"
    return None


def _block_problem(key: str, value: Any) -> str | None:
    if key in SERIES_BLOCKS:
        return _series_problem(value)
    if key in OBJECT_BLOCKS:
        if not isinstance(value, dict):
            return "is not an object"
        if key == "image_cache":
            return next((f"{k}: {p}" for k, v in value.items() if v is not None
                         if (p := _object_or_stats(v)) is not None), None)
        return None
    if key in LIST_BLOCKS:
        return None if isinstance(value, list) else "is not a list"
    if key in STAT_BLOCKS or (isinstance(value, dict) and "avg" in value):
        return _stats_problem(value)
    return None


STAT_BLOCKS = frozenset((
    "time_to_first_token", "request_latency", "inter_token_latency", "time_to_second_token",
    "output_token_throughput_per_user", "output_sequence_length", "input_sequence_length",
    "num_images", "client_added_ttft", "request_throughput", "output_token_throughput",
    "benchmark_duration", "request_count", "error_request_count", "total_output_tokens",
    "total_input_tokens", "total_osl", "total_isl", "total_images", "goodput",
    "good_request_count"))


def _is_number(v: Any) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool)


def _stats_problem(value: Any) -> str | None:
    if not isinstance(value, dict):
        return "is not a statistics object"
    for stat, v in value.items():
        if v is None or isinstance(v, (str, dict)) and stat in ("unit", "slos", "note"):
            continue
        if not _is_number(v):
            return f"{stat} is not a number"
    return None


def _object_or_stats(value: Any) -> str | None:
    if not isinstance(value, dict):
        return "is not an object"
    return _stats_problem(value) if "avg" in value else None


def _series_problem(value: Any) -> str | None:
    if not isinstance(value, dict):
        return "is not an object"
    for name, v in value.items():
        if isinstance(v, list) and not all(x is None or _is_number(x) for x in v):
            return f"{name} holds a value that is not a number"
        if isinstance(v, dict):
            return f"{name} is an object, not a series"
    return None


def _value(doc: dict, tag: str, stat: str) -> float | None:
    block = doc.get(tag)
    if block is None and isinstance(doc.get("records"), dict):  # tolerate nested layouts
        block = doc["records"].get(tag)
    if not isinstance(block, dict):
        return None
    v = block.get(stat)
    return float(v) if isinstance(v, (int, float)) else None


def delta_pct(a: float | None, b: float | None) -> float | None:
    if a is None or b is None or b == 0:
        return None
    return (a - b) / b * 100.0


def _cache_value(export: dict, key: str, stat: str) -> float | None:
    """A cache number of a run: measured from the simulator's per-request headers, else from
    the server's own counters (``/metrics`` deltas: vLLM, Dynamo), so a simulator run and a
    real engine's run of one workload line up."""
    cache = export.get("image_cache") or {}
    block = cache.get(key) or {}
    if key == "measured" and block.get(stat) is None:
        block = cache.get("server_metrics") or {}
    value = block.get(stat)
    return float(value) if isinstance(value, (int, float)) else None


def compare(a: dict, b: dict, labels: tuple[str, str]) -> dict[str, Any]:
    """Rows of (metric, A, B, delta %) plus cache hit rates when both runs measured them."""
    rows = []
    for label, tag, stat in ROWS:
        va, vb = _value(a, tag, stat), _value(b, tag, stat)
        rows.append({"metric": label, "tag": tag, "stat": stat, "a": va, "b": vb,
                     "delta_pct": delta_pct(va, vb)})
    if _value(a, "goodput", "avg") is not None or _value(b, "goodput", "avg") is not None:
        for label, tag in (("Goodput (req/s)", "goodput"), ("Good requests", "good_request_count")):
            va, vb = _value(a, tag, "avg"), _value(b, tag, "avg")
            rows.append({"metric": label, "tag": tag, "stat": "avg", "a": va, "b": vb,
                         "delta_pct": delta_pct(va, vb)})
    for label, key, stat in (("Image cache hits, predicted", "predicted", "hits"),
                             ("Image cache hits, measured", "measured", "hits"),
                             ("Image cache hit rate (%)", "measured", "hit_rate")):
        va, vb = _cache_value(a, key, stat), _cache_value(b, key, stat)
        if va is None and vb is None:
            continue
        if stat == "hit_rate":
            va, vb = (None if v is None else v * 100 for v in (va, vb))
        rows.append({"metric": label, "tag": "image_cache", "stat": stat, "a": va, "b": vb,
                     "delta_pct": None})
    return {"labels": list(labels), "rows": rows}


def _num(v: float | None) -> str:
    return "N/A" if v is None else f"{v:,.1f}"


def _pct(v: float | None) -> str:
    return "N/A" if v is None else f"{v:+.1f} %"


def markdown(table: dict) -> str:
    la, lb = (label.replace("|", "\\|") for label in table["labels"])  # a label never splits a cell
    lines = [f"| Metric | {la} | {lb} | Delta |", "|---|---|---|---|"]
    for r in table["rows"]:
        lines.append(f"| {r['metric']} | {_num(r['a'])} | {_num(r['b'])} | {_pct(r['delta_pct'])} |")
    return "\n".join(lines) + "\n"


def plain(table: dict) -> str:
    la, lb = table["labels"]
    rows = [("Metric", la, lb, "Delta %")]
    rows += [(r["metric"], _num(r["a"]), _num(r["b"]), _pct(r["delta_pct"])) for r in table["rows"]]
    w = [max(len(r[i]) for r in rows) for i in range(4)]
    out = []
    for i, r in enumerate(rows):
        out.append("  ".join([r[0].ljust(w[0])] + [c.rjust(x) for c, x in zip(r[1:], w[1:])]))
        if i == 0:
            out.append("  ".join("-" * x for x in w))
    return "\n".join(out)


def chart(table: dict, path: Path) -> None:
    """Grouped bars of A vs B per metric, normalised to B (needs matplotlib)."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        raise UserError("the PNG chart needs matplotlib: pip install matplotlib") from None
    rows = [r for r in table["rows"] if r["a"] is not None and r["b"] and r["tag"] != "image_cache"]
    if not rows:
        raise UserError("nothing to chart: no metric present in both runs")
    la, lb = table["labels"]
    fig, ax = plt.subplots(figsize=(9, 4.5))
    xs = range(len(rows))
    ax.bar([x - 0.2 for x in xs], [r["a"] / r["b"] * 100 for r in rows], 0.4, label=la)
    ax.bar([x + 0.2 for x in xs], [100.0] * len(rows), 0.4, label=lb)
    for x, r in zip(xs, rows):
        ax.annotate(_pct(r["delta_pct"]), (x - 0.2, r["a"] / r["b"] * 100), ha="center",
                    va="bottom", fontsize=8)
    ax.set_xticks(list(xs))
    ax.set_xticklabels([r["metric"] for r in rows], rotation=20, ha="right", fontsize=8)
    ax.set_ylabel(f"% of {lb}")
    ax.legend()
    fig.tight_layout()
    from ..io.atomic import atomic_open

    with atomic_open(path, "wb") as fh:
        fig.savefig(fh, format="png", dpi=120)
    plt.close(fig)


def write_comparison(a: dict, b: dict, labels: tuple[str, str], out: Path, with_chart: bool
                     ) -> tuple[str, list[Path]]:
    """comparison.md / .json (/ .png) in ``out``; returns the plain table and the files."""
    from ..io.atomic import atomic_write_bytes

    table = compare(a, b, labels)
    try:
        out.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise UserError(f"cannot create {out}: {exc.strerror}") from None
    atomic_write_bytes(out / "comparison.md", markdown(table).encode())
    atomic_write_bytes(out / "comparison.json", orjson.dumps(table, option=orjson.OPT_INDENT_2))
    written = [out / "comparison.md", out / "comparison.json"]
    if with_chart:
        chart(table, out / "comparison.png")
        written.append(out / "comparison.png")
    return plain(table), written
