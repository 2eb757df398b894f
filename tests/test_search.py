"""``sweep --search rate``: bisection to the highest request rate that meets the SLOs, in
virtual time (fast, with a known answer) and against a server."""
from __future__ import annotations

import csv
import io
import json
import subprocess
import sys
import time
from pathlib import Path

import orjson
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from mmdatagen.loadgen.search import bisect_rate
from tests.conftest import run_subprocess

MODEL = "Qwen/Qwen3-VL-30B-A3B-Instruct-FP8"


@settings(max_examples=300, deadline=None)
@given(limit=st.floats(1e-3, 1e5), lo=st.floats(1e-3, 100), span=st.one_of(
    st.none(), st.floats(1.01, 1e4)), precision=st.floats(1e-3, 1.0))
def test_bisection_brackets_a_monotone_limit(limit, lo, span, precision):
    """Pass iff rate <= limit (a monotone system with a known answer): the result is the
    highest passing rate probed, the limit lies below the lowest failing one, and the two are
    within the precision."""
    probed: list[float] = []

    def passes(rate: float) -> bool:
        probed.append(rate)
        return rate <= limit

    hi = None if span is None else lo * span
    passing, failing = bisect_rate(passes, lo, hi, precision)
    assert len(probed) == len(set(probed)) <= 60
    if limit < lo:
        assert (passing, failing) == (None, lo) and probed == [lo]
    elif hi is not None and limit >= hi:
        assert (passing, failing) == (hi, None)
    else:
        assert failing is not None and passing is not None
        assert passing <= limit < failing
        assert passing == max(r for r in probed if r <= limit)
        assert failing == min(r for r in probed if r > limit)
        assert failing / passing <= (1 + precision) * (1 + 1e-5)  # 6-digit rates


def _sweep_args(tmp_path, *extra):
    data = tmp_path / "d.jsonl"
    if not data.exists():
        res = run_subprocess("pool", "-n", 40, "--pool-size", 40, "--image-size", "64x48",
                             "--text-tokens", 16, "--tokenizer", "words", "-o", data, "-q")
        assert res.returncode == 0, res.stderr
    return ["sweep", "--input-file", data, "--request-count", 40, "--no-report", *extra]


def test_virtual_search_finds_the_known_queueing_limit(tmp_path):
    """A serial frontend of 100 ms per request and nothing else: at a constant rate r above
    10/s the k-th request waits k (100 - 1000/r) ms more, so 40 requests all meet TTFT <= 139
    ms exactly while r <= 1 / (0.1 - 0.039 / 39) = 10.101 req/s."""
    args = _sweep_args(tmp_path, "--virtual", "--profile", "zero-delay", "--sim-param",
                       "frontend_request_ms=100", "--arrival", "constant", "--goodput",
                       "ttft:139", "--slo-attainment", 1, "--search", "rate", "--search-min", 1,
                       "--search-max", 40, "--search-precision", 0.01, "--repeats", 2,
                       "--output-dir", tmp_path / "sw")
    res = run_subprocess(*args)
    assert res.returncode == 0, res.stderr
    doc = orjson.loads((tmp_path / "sw" / "sweep.json").read_bytes())
    search = doc["search"]
    result = search["result"]
    assert result["request_rate"] <= 1 / 0.099 < result["lowest_failing"]
    assert result["lowest_failing"] / result["request_rate"] <= 1.01
    probes = search["probes"]
    assert [p["passed"] for p in probes[:2]] == [True, False]  # the bounds: 1 and 40 req/s
    assert all(p["request_rate"] < q["request_rate"] for p in probes if p["passed"]
               for q in probes if not q["passed"])
    for p in probes:  # the decision and what it shows: every request within 139 ms, or not
        ttft = p["slo_metrics"]["time_to_first_token"]
        assert ttft["quantile"] == "p100" and ttft["objective"] == 139
        assert p["passed"] == (p["attainment"] == 1.0) == (ttft["value"] <= 139)
        assert len(p["attainments"]) == 2
    # each probe printed as it ran, and the result
    assert "probe 1: 1 req/s PASS; attainment 1.000 >= 1" in res.stderr
    assert "probe 2: 40 req/s FAIL" in res.stderr and "ttft p100 3025 misses 139 ms" in res.stderr
    assert f"highest rate meeting the SLOs: {result['request_rate']:g} req/s" in res.stdout
    rows = list(csv.DictReader(io.StringIO((tmp_path / "sw" / "search.csv").read_text())))
    assert [float(r["request_rate"]) for r in rows] == [p["request_rate"] for p in probes]
    assert [r["passed"] for r in rows] == [str(p["passed"]) for p in probes]
    runs = list(csv.DictReader(io.StringIO((tmp_path / "sw" / "sweep.csv").read_text())))
    assert len(runs) == 2 * len(probes) and doc["grid"]["request_rate"] == sorted(
        float(r["request_rate"]) for r in rows)
    # a rerun resumes every probe's runs and reaches the same result
    again = run_subprocess(*args)
    assert again.returncode == 0, again.stderr
    doc2 = orjson.loads((tmp_path / "sw" / "sweep.json").read_bytes())
    assert doc2["search"]["result"] == result
    assert all(r["resumed"] for p in doc2["points"] for r in p["runs"])


@pytest.mark.parametrize("extra,needle", [
    (["--search", "rate"], "--goodput"),
    (["--search", "rate", "--goodput", "ttft:100", "--request-rate", "2"], "--request-rate"),
    (["--search", "rate", "--goodput", "ttft:100", "--concurrency", "1,2"], "concurrency"),
    (["--search", "rate", "--goodput", "ttft:100", "--search-min", "4", "--search-max", "2"],
     "--search-max"),
    (["--search", "rate", "--goodput", "ttft:100", "--ramp-to", "3"], "--ramp-to"),
    (["--search", "size"], "--search"),
])
def test_search_refuses_what_it_cannot_do(tmp_path, extra, needle):
    res = run_subprocess(*_sweep_args(tmp_path, "--virtual", "--output-dir", tmp_path / "o",
                                      *extra))
    assert res.returncode == 2 and needle in res.stderr and "Traceback" not in res.stderr
    assert len(res.stderr.strip().splitlines()) == 1, res.stderr


def test_search_against_a_server(tmp_path):
    """Over HTTP on 'mmdatagen serve' (zero delay): every probe passes a loose SLO, so the
    result is the upper bound; each probe's runs are real benchmarks."""
    ready = tmp_path / "ready.json"
    proc = subprocess.Popen([sys.executable, "-m", "mmdatagen", "serve", "--port", "0",
                             "--profile", "zero-delay", "--ready-file", str(ready)],
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        deadline = time.monotonic() + 60
        while not ready.exists() or not ready.read_text().strip().endswith("}"):
            assert proc.poll() is None and time.monotonic() < deadline, "serve did not start"
            time.sleep(0.1)
        url = json.loads(ready.read_text())["url"]
        res = run_subprocess(*_sweep_args(
            tmp_path, "--url", url, "--model", MODEL, "--request-count", 6, "--goodput",
            "e2el:5000",
            "--search", "rate", "--search-min", 20, "--search-max", 40, "--repeats", 1,
            "--output-dir", tmp_path / "sw"))
    finally:
        proc.terminate()
        proc.wait(timeout=30)
    assert res.returncode == 0, res.stderr
    doc = orjson.loads((tmp_path / "sw" / "sweep.json").read_bytes())
    assert [p["request_rate"] for p in doc["search"]["probes"]] == [20, 40]
    assert doc["search"]["result"]["request_rate"] == 40
    assert doc["search"]["result"]["lowest_failing"] is None
    assert "every rate probed meets the SLOs, up to 40 req/s" in res.stdout
    for p in doc["points"]:
        ex = orjson.loads((Path(p["runs"][0]["dir"]) / "profile_export_mmdatagen.json")
                          .read_bytes())
        assert ex["request_count"]["avg"] == 6 and ex["good_request_count"]["avg"] == 6
        assert ex["input_config"]["request_rate"] == p["params"]["request_rate"]
