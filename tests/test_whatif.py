"""The what-if (``simulate DATASET --profile P --cache-size a,b,c``): TTFT (avg, p50, p99),
throughput and hit rate per cache size, with an interval propagated from a calibrated
profile's cost uncertainties (sigma points along the covariance's principal axes), the knee of
the curve and where an SLO is met, in the console, sweep.json and the report."""
from __future__ import annotations

import json
import math
from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest
import yaml
from click.testing import CliRunner

from mmdatagen.cli import cli
from mmdatagen.sim import whatif
from mmdatagen.sim.profile import load_profile, profile_from_dict

COSTS = {"frontend_request_ms": (1.5, 0.2), "step_base_ms": (4.0, 0.4),
         "per_seq_ms": (0.3, 0.03), "per_prefill_token_ms": (0.02, 0.002),
         "frontend_image_ms": (7.0, 0.7), "per_encoder_image_ms": (12.0, 2.0)}
CORR = [[1.0, -0.6, 0.0, 0.0, 0.0, 0.0], [-0.6, 1.0, 0.2, 0.0, 0.0, 0.0],
        [0.0, 0.2, 1.0, 0.0, 0.0, 0.0], [0.0, 0.0, 0.0, 1.0, 0.0, -0.3],
        [0.0, 0.0, 0.0, 0.0, 1.0, 0.0], [0.0, 0.0, 0.0, -0.3, 0.0, 1.0]]
PROFILE = {"description": "calibrated-like profile of the what-if test", "model": "qwen3-vl-30b-a3b",
           "cache": "dynamo-embedding", "max_running": 64, "token_budget": 8192,
           "natural_output_tokens": 16, "text_bytes_per_token": 6.0,
           **{k: v for k, (v, _) in COSTS.items()}}
CALIBRATION = {"parameters": {k: {"value": v, "se": se} for k, (v, se) in COSTS.items()},
               "correlation": CORR}


def _invoke(*args: object) -> tuple[int, str]:
    res = CliRunner().invoke(cli, [str(a) for a in args])
    return res.exit_code, res.output


@pytest.fixture(scope="module")
def files(tmp_path_factory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("whatif")
    (root / "cal.yaml").write_text(yaml.safe_dump({**PROFILE, "calibration": CALIBRATION}))
    (root / "plain.yaml").write_text(yaml.safe_dump(PROFILE))
    code, out = _invoke("pool", "-n", "160", "--pool-size", "40", "--tokenizer", "words",
                        "--image-content", "solid", "--text-tokens", "200", "-o",
                        root / "pool.jsonl", "--quiet")
    assert code == 0, out
    return {"cal": root / "cal.yaml", "plain": root / "plain.yaml",
            "data": root / "pool.jsonl", "root": root}


def _covariance() -> np.ndarray:
    se = np.array([se for _, se in COSTS.values()])
    return np.array(CORR) * np.outer(se, se)


def test_sigma_points_reproduce_the_covariance():
    prof = profile_from_dict({**PROFILE, "calibration": CALIBRATION}, "cal")
    names, cov = whatif.uncertainty(prof)
    assert names == list(COSTS)
    assert np.allclose(cov, _covariance())
    pairs = whatif.sigma_points(prof)
    assert len(pairs) == len(COSTS)
    # half the difference of each pair is one principal axis scaled by its sigma: their outer
    # products sum to the covariance
    half = [np.array([(getattr(hi, n) - getattr(lo, n)) / 2 for n in names]) for hi, lo in pairs]
    assert np.allclose(sum(np.outer(h, h) for h in half), _covariance())
    for hi, lo in pairs:  # symmetric about the profile's own values
        for n in names:
            assert (getattr(hi, n) + getattr(lo, n)) / 2 == pytest.approx(getattr(prof, n))


def test_interval_of_a_linear_metric_is_its_first_order_sigma():
    """A metric linear in the costs, m = g . theta: the interval is m ± sqrt(g' S g) (with the
    correlations), not the independent-errors sum."""
    prof = profile_from_dict({**PROFILE, "calibration": CALIBRATION}, "cal")
    names = list(COSTS)
    g = np.array([3.0, 5.0, -40.0, 1000.0, 2.0, 1.0])

    def rows(p) -> list[dict]:
        m = float(g @ np.array([getattr(p, n) for n in names]))
        return [{"cache_gb": 1.0, "ttft_p50": m, "hit_rate": 50.0}]

    pairs = [(rows(hi), rows(lo)) for hi, lo in whatif.sigma_points(prof)]
    out = whatif.interval_rows(rows(prof), pairs)[0]
    sd = math.sqrt(g @ _covariance() @ g)
    lo, hi = out["interval"]["ttft_p50"]
    assert (hi - out["ttft_p50"], out["ttft_p50"] - lo) == pytest.approx((sd, sd))
    independent = math.sqrt(sum((gi * se) ** 2 for gi, (_, se) in zip(g, COSTS.values())))
    assert abs(sd - independent) > 0.05 * sd  # the correlations matter here
    assert out["interval"]["hit_rate"] == [50.0, 50.0]


def test_knee_and_slo():
    rows = [{"cache_gb": x, "time_to_first_token": y, "ttft_p99": y * 2,
             "interval": {"ttft_p99": [y * 2 - 5, y * 2 + 5]}}
            for x, y in [(0, 400.0), (1, 120.0), (2, 110.0), (4, 105.0), (8, 100.0)]]
    assert whatif.knee(rows) == 1
    assert whatif.knee(rows[:2]) is None
    assert whatif.slo_met(rows, ("ttft_p99", 225.0)) == 2  # size 2: p99 220, upper end 225
    assert whatif.slo_met(rows, ("ttft_p99", 224.0)) == 4  # the upper end must be within
    assert whatif.slo_met(rows, ("ttft_p99", 100.0)) is None
    assert whatif.parse_slo("ttft_p50:250") == ("ttft_p50", 250.0)


def test_whatif_cli_prints_intervals_and_writes_the_report(files):
    out = files["root"] / "wf"
    code, text = _invoke("simulate", files["data"], "--profile", files["cal"], "--concurrency",
                         "8", "--cache-size", "0,0.005,0.01,0.02,1", "--encoder-budget", "300",
                         "--slo", "ttft_avg:130", "--output-dir", out)
    assert code == 0, text
    assert "TTFT p99 ms" in text and "Req/s" in text and "interval: ±1 sigma" in text
    doc = json.loads((out / "sweep.json").read_text())
    rows = doc["rows"]
    assert [r["cache_gb"] for r in rows] == [0, 0.005, 0.01, 0.02, 1]
    assert rows[0]["hit_rate"] == 0 and rows[-1]["hit_rate"] > rows[1]["hit_rate"] > 0
    for r in rows:
        for m in ("time_to_first_token", "ttft_p50", "ttft_p99", "request_throughput"):
            lo, hi = r["interval"][m]
            assert lo < r[m] < hi, (m, r)
    # the centre is the profile's own run: the same numbers as a plain profile's what-if
    code, plain = _invoke("simulate", files["data"], "--profile", files["plain"],
                          "--concurrency", "8", "--cache-size", "0,0.005,0.01,0.02,1",
                          "--encoder-budget", "300", "--slo", "ttft_p99:1000",
                          "--output-dir", files["root"] / "plain")
    assert code == 0, plain
    assert "no interval: the profile carries no calibration" in plain
    assert "upper end" not in plain and "(upper end of the interval)" in text
    prows = json.loads((files["root"] / "plain" / "sweep.json").read_text())["rows"]
    assert [r["ttft_p50"] for r in prows] == [r["ttft_p50"] for r in rows]
    assert "interval" not in prows[0]
    met = doc["slo_met"]
    assert doc["slo"] == ["time_to_first_token", 130.0]
    assert met == min(r["cache_gb"] for r in rows
                      if r["interval"]["time_to_first_token"][1] <= 130)
    # the interval's upper end decides: a size whose centre alone meets it may not
    assert met > min(r["cache_gb"] for r in rows if r["time_to_first_token"] <= 130)
    assert f"SLO ttft_avg <= 130 ms: met from {met:g} GiB (upper end of the interval)" in text
    html = (out / "report.html").read_text()
    assert 'data-kind="whatif"' in html and "TTFT vs cache size" in html and "<svg" in html
    assert "SLO" in html


def test_whatif_bad_input_is_one_line(files):
    for args, needle in [(["--cache-size", "0,1", "--slo", "ttft_p90:100"], "--slo must be"),
                         (["--cache-size", "0,1", "--slo", "ttft_p50:-3"], "--slo needs"),
                         (["--cache-size", "1", "--slo", "ttft_p50:100"],
                          "--slo needs several --cache-size")]:
        code, text = _invoke("simulate", files["data"], "--profile", files["plain"], *args)
        assert code == 2 and needle in text and "Traceback" not in text, text


def test_sigma_points_hold_costs_at_zero():
    prof = replace(load_profile("zero-delay"), calibration={
        "parameters": {"step_base_ms": {"value": 0.0, "se": 1.0}}})
    (hi, lo), = whatif.sigma_points(prof)
    assert hi.step_base_ms == pytest.approx(1.0) and lo.step_base_ms == 0.0
