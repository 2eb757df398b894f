"""``mmdatagen calibrate``: runs simulated in virtual time with a KNOWN profile (vLLM's processor
cache on and off, concurrency 1 and 2, three datasets) are calibrated; the fitted costs must be
the known ones, and the fitted profile must predict held-out runs (concurrency 8, another
dataset and image size) within 15 %. Refusals: runs that cannot identify a cost."""
from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import yaml
from click.testing import CliRunner

from mmdatagen.cli import cli
from mmdatagen.sim import calibrate as cal
from mmdatagen.sim.profile import load_profile

KNOWN = {"step_base_ms": 4.0, "per_seq_ms": 0.3, "per_prefill_token_ms": 0.02,
         "per_encoder_image_ms": 12.0, "frontend_request_ms": 1.5, "frontend_image_ms": 7.0}
PROFILE = {"description": "known profile of the calibrate test", "model": "qwen3-vl-30b-a3b",
           "cache": "vllm-processor", "max_running": 64, "token_budget": 8192,
           "natural_output_tokens": 32, "text_bytes_per_token": 6.0, **KNOWN}
# dataset name -> pool flags: prompt lengths and images per request vary independently
DATASETS = {"a": ["-n", "40", "--pool-size", "10", "--text-tokens", "200", "--seed", "0"],
            "b": ["-n", "40", "--pool-size", "10", "--text-tokens", "600", "--seed", "1",
                  "--images-per-request", "2"],
            "d": ["-n", "40", "--pool-size", "10", "--text-tokens", "1200", "--seed", "3"],
            "c": ["-n", "60", "--pool-size", "20", "--text-tokens", "400", "--seed", "2",
                  "--image-size", "800x600"]}
# (dataset, concurrency, processor cache GiB)
TRAIN = [("a", 1, 4), ("a", 1, 0), ("b", 1, 4), ("d", 1, 4), ("d", 2, 0), ("a", 2, 4)]
HELD_OUT = [("c", 8, 4), ("a", 8, 0)]
# relative tolerance of each recovered cost: the decode-window rows approximate how a request
# overlapping another in part spreads its tokens, which biases the step's split (base vs per
# running sequence) by a few percent at concurrency 2
TOLERANCE = {"step_base_ms": 0.03, "per_seq_ms": 0.12, "per_prefill_token_ms": 0.03,
             "per_encoder_image_ms": 0.03, "frontend_request_ms": 0.10,
             "frontend_image_ms": 0.03}


def _invoke(*args: object) -> tuple[int, str]:
    res = CliRunner().invoke(cli, [str(a) for a in args])
    return res.exit_code, res.output


@pytest.fixture(scope="module")
def runs(tmp_path_factory) -> dict[tuple[str, int, float], Path]:
    root = tmp_path_factory.mktemp("calibrate")
    (root / "known.yaml").write_text(yaml.safe_dump(PROFILE))
    for name, flags in DATASETS.items():
        code, out = _invoke("pool", *flags, "--tokenizer", "words", "--image-content", "solid",
                            "-o", root / f"{name}.jsonl", "--quiet")
        assert code == 0, out
    folders = {}
    for ds, conc, size in TRAIN + HELD_OUT:
        folder = root / f"run_{ds}_{conc}_{size}"
        code, out = _invoke("simulate", root / f"{ds}.jsonl", "--profile", root / "known.yaml",
                            "--concurrency", conc, "--cache-size", size, "--output-dir", folder,
                            "--quiet")
        assert code == 0, out
        folders[(ds, conc, size)] = folder
    return folders


def test_recovers_known_costs_and_predicts_held_out(runs, tmp_path):
    out = tmp_path / "fitted.yaml"
    code, text = _invoke("calibrate", *(runs[k] for k in TRAIN), "-o", out, "--base-profile",
                         runs[TRAIN[0]].parent / "known.yaml")
    assert code == 0, text
    assert "± se" in text and "run_d_2_0" in text
    prof = load_profile(str(out))  # a normal profile
    assert prof.cache == "vllm-processor" and prof.max_running == 64
    params = prof.calibration["parameters"]
    for name, true in KNOWN.items():
        got = getattr(prof, name)
        assert abs(got / true - 1) <= TOLERANCE[name], (name, got, true)
        assert params[name]["se"] > 0
    corr = np.array(prof.calibration["correlation"])  # what the what-if's interval uses
    assert corr.shape == (len(cal.PARAMS),) * 2 and np.allclose(corr, corr.T)
    assert np.allclose(np.diag(corr), 1.0) and np.all(np.abs(corr) <= 1.0)
    assert np.all(np.linalg.eigvalsh(corr) > -1e-9)  # a covariance, positive semi-definite
    for key in HELD_OUT:
        run = cal.load_run(runs[key], "vllm-processor")
        measured, predicted = cal.measured(run), cal.predict(run, prof)
        assert predicted is not None
        for metric in ("ttft_p50", "throughput"):
            assert abs(predicted[metric] / measured[metric] - 1) <= 0.15, (key, metric)


def test_fitted_profile_runs_with_simulate(runs, tmp_path):
    out = tmp_path / "fitted.yaml"
    known = runs[TRAIN[0]].parent / "known.yaml"
    code, text = _invoke("calibrate", *(runs[k] for k in TRAIN), "-o", out, "--quiet",
                         "--base-profile", known)
    assert code == 0, text
    rows = {}
    for name, prof in (("fit", out), ("known", known)):
        code, text = _invoke("simulate", runs[TRAIN[0]].parent / "c.jsonl", "--profile", prof,
                             "--concurrency", 4, "--cache-size", "0,4", "--request-count", 20,
                             "--output-dir", tmp_path / name)
        assert code == 0, text
        # the what-if of a fitted profile has intervals, the known profile's has none
        assert "Hit rate" in text and ("interval: ±1 sigma" in text) == (name == "fit")
        rows[name] = json.loads((tmp_path / name / "sweep.json").read_text())["rows"]
    for f, k in zip(rows["fit"], rows["known"]):
        assert f["hit_rate"] == k["hit_rate"]
        for metric in ("time_to_first_token", "ttft_p50", "request_throughput"):
            lo, hi = f["interval"][metric]
            assert lo < f[metric] < hi and "interval" not in k
            assert abs(f[metric] / k[metric] - 1) <= 0.15, (metric, f, k)


def test_refuses_runs_without_hits(runs, tmp_path):
    """Cache off everywhere: what a hit saves cannot be fitted; the line says what to add."""
    code, text = _invoke("calibrate", runs[("a", 1, 0)], runs[("d", 2, 0)], runs[("b", 1, 4)],
                         "-o", tmp_path / "f.yaml")
    assert code == 0, text  # b's hits identify it
    code, text = _invoke("calibrate", runs[("a", 1, 0)], runs[("d", 2, 0)],
                         "-o", tmp_path / "g.yaml")
    assert code == 2
    assert "frontend_image_ms (no cache hits at all: add a run whose images repeat" in text
    assert not (tmp_path / "g.yaml").exists()


def test_refuses_concurrency_one_only_unless_held(runs, tmp_path):
    alone = [runs[k] for k in TRAIN if k[1] == 1]
    code, text = _invoke("calibrate", *alone, "-o", tmp_path / "f.yaml")
    assert code == 2
    assert "per_seq_ms (every request ran alone" in text and "concurrency 2 or more" in text
    code, text = _invoke("calibrate", *alone, "-o", tmp_path / "f.yaml", "--hold",
                         "per_seq_ms", "--base-profile", runs[TRAIN[0]].parent / "known.yaml")
    assert code == 0, text
    assert load_profile(str(tmp_path / "f.yaml")).per_seq_ms == KNOWN["per_seq_ms"]


def test_bad_input_is_one_line(runs, tmp_path):
    code, text = _invoke("calibrate", tmp_path, "-o", tmp_path / "f.yaml")
    assert code == 2 and "no records.jsonl" in text
    code, text = _invoke("calibrate", runs[TRAIN[0]], "-o", tmp_path / "f.yaml", "--hold", "x")
    assert code == 2 and "unknown parameters x" in text
