"""Class 12, values from outside the spec layer are checked once, where they are read: dataset
rows (``io.readers``), manifests (``io.manifest``), exports given to compare (``loadgen.compare.
export_problem``), and the free-form flags (``--sim-param``, ``--extra-inputs``, ``--goodput``,
``--request-rate``, paths and labels). Each bad value: one line, exit 2, nothing written."""
from __future__ import annotations

import json
import os
import shutil

import pytest

from .helpers import listing, one_error_line, run


@pytest.mark.parametrize("row,needle", [
    ({"text": "hi", "videos": [5]}, "videos must be strings"),
    ({"text": "hi", "audios": [5]}, "audios must be strings"),
    ({"text": "hi", "videos": [None, {"url": "x"}]}, "videos must be strings"),
    ({"text": "hi", "video": 7}, "videos must be strings"),
    ({"session_id": "s", "turns": [{"text": "a", "videos": [7]}]}, "videos must be strings"),
    ({"text": "hi", "timestamp": "soon"}, "'timestamp' must be a finite number"),
    ({"text": "hi", "delay": -5}, "'delay' must be a finite number"),
    ({"text": "hi", "output_length": True}, "'output_length' must be a positive integer"),
])
@pytest.mark.parametrize("command", ["analyze", "simulate"])
def test_dataset_rows_of_the_wrong_type(tmp_path, row, needle, command):
    (tmp_path / "r.jsonl").write_text(json.dumps(row) + "\n")
    args = ["analyze", "r.jsonl", "--cache-images", 10] if command == "analyze" else \
        ["simulate", "r.jsonl", "-q", "--profile", "zero-delay"]
    res = run(*args, cwd=tmp_path)
    assert res.returncode == 2 and needle in one_error_line(res.stderr)  # was: a traceback


def test_a_null_media_entry_is_skipped_as_aiperf_does(tmp_path):
    (tmp_path / "r.jsonl").write_text(json.dumps({"text": "hi", "audios": [None]}) + "\n")
    assert run("analyze", "r.jsonl", "--cache-images", 10, cwd=tmp_path).returncode == 0


def test_a_manifest_missing_its_last_row(tmp_path, small_dataset):
    data = tmp_path / "d.jsonl"
    shutil.copy(small_dataset, data)
    manifest = json.loads(open(f"{small_dataset}.manifest.json").read())
    manifest["rows"] = manifest["rows"][:-1]  # the jsonl block (size, hash) left intact
    (tmp_path / "d.jsonl.manifest.json").write_text(json.dumps(manifest))
    res = run("analyze", "d.jsonl", "--cache-images", 10, cwd=tmp_path, timeout=60)
    assert res.returncode == 2  # was: accepted, 199 requests reported for a 200-line file
    assert "disagree on the line count: rows 199" in one_error_line(res.stderr)


@pytest.fixture(scope="module")
def two_runs(tmp_path_factory, small_dataset):
    folder = tmp_path_factory.mktemp("runs")
    for name in ("ra", "rb"):
        assert run("bench", "--input-file", small_dataset, "--request-count", 3, "--profile",
                   "zero-delay", "-q", "--output-dir", name, cwd=folder).returncode == 0
    return folder


@pytest.mark.parametrize("key,value,needle", [
    ("timeline", [1, 2], "'timeline' is not an object"),
    ("time_to_first_token", "fast", "'time_to_first_token' is not a statistics object"),
    ("request_latency", {"unit": "ms", "avg": "1"}, "avg is not a number"),
    ("distributions", {"levels_pct": [1, "x"]}, "levels_pct holds a value"),
    ("image_cache", {"measured": "all"}, "measured: is not an object"),
])
def test_compare_refuses_an_export_of_the_wrong_shape(tmp_path, two_runs, key, value, needle):
    bad = tmp_path / "bad"
    shutil.copytree(two_runs / "ra", bad)
    export = bad / "profile_export_mmdatagen.json"
    doc = json.loads(export.read_text())
    doc[key] = value
    export.write_text(json.dumps(doc))
    res = run("compare", bad, two_runs / "rb", "--output-dir", "out", cwd=tmp_path)
    assert res.returncode == 2 and needle in one_error_line(res.stderr)  # was: a traceback
    assert not (tmp_path / "out").exists() or listing(tmp_path / "out") == []


SWEEP = ["sweep", "--virtual", "--concurrency", 1, "--repeats", 1, "--request-count", 3, "-q",
         "--output-dir", "sw"]


@pytest.mark.parametrize("param,needle", [
    ("max_running=nan", "max_running must be an integer"),  # was: a traceback (stalled)
    ("default_image_size=../../../ESCAPE", "default_image_size must be two positive integers"),
    ("step_base_ms=inf", "step_base_ms must be a number (finite)"),
    ("token_budget=many", "token_budget must be an integer"),
    ("key_mode=../bytes", "key_mode must be one of"),
])
def test_sim_param_values_are_checked_before_any_run(tmp_path, small_dataset, param, needle):
    res = run(*SWEEP, "--input-file", small_dataset, "--sim-param", param, cwd=tmp_path)
    assert res.returncode == 2 and needle in one_error_line(res.stderr)
    assert listing(tmp_path) == []  # was: ESCAPE.yaml and a run folder outside --output-dir


def test_sim_param_folders_stay_inside_the_sweep(tmp_path, small_dataset):
    res = run(*SWEEP, "--input-file", small_dataset, "--sim-param",
              "default_image_size=320x240,64x64", cwd=tmp_path)
    assert res.returncode == 0, res.stderr
    assert {p.split("/")[0] for p in listing(tmp_path)} == {"sw"}
    assert (tmp_path / "sw" / "profiles" / "concurrency-1_default_image_size-64x64.yaml").is_file()


def test_point_names_are_one_path_component():
    from mmdatagen.loadgen.sweep import point_name

    names = {point_name({"cache": v}) for v in ("../x", "..", "a/b", "a_b", "a b")}
    assert len(names) == 5 and not any("/" in n or n in (".", "..") for n in names)


@pytest.mark.parametrize("flag,value,needle", [
    ("--extra-inputs", "max_tokens:99999999999999999999999", "beyond the 64-bit integer range"),
    ("--extra-inputs", "max_tokens:NaN", "nan is not a finite number"),
    ("--extra-inputs", '{"a": [1, 1e999]}', "not valid JSON"),
    ("--extra-inputs", "temperature:inf", "inf is not a finite number"),
    ("--goodput", "ttft:inf", "positive finite number"),
    ("--request-rate", "1e-300", "--request-rate must be >= 0.001"),  # was: a hang
    ("--ramp-to", "1e-300", "--ramp-to must be >= 0.001"),
])
def test_free_form_flags_refuse_what_json_or_time_cannot_hold(tmp_path, small_dataset, flag,
                                                              value, needle):
    extra = ["--request-rate", 5] if flag == "--ramp-to" else []
    res = run("bench", "--input-file", small_dataset, "--request-count", 2, "-q", "--output-dir",
              "out", flag, value, *extra, cwd=tmp_path, timeout=60)
    assert res.returncode == 2 and needle in one_error_line(res.stderr)
    assert listing(tmp_path) == []


def test_sweep_grid_rates_have_the_same_floor(tmp_path, small_dataset):
    res = run("sweep", "--input-file", small_dataset, "--virtual", "--request-rate", "1e-300,5",
              "-q", "--output-dir", "sw", cwd=tmp_path)
    assert res.returncode == 2 and "--request-rate must be >= 0.001" in one_error_line(res.stderr)


@pytest.mark.parametrize("value,needle", [
    ("max_tokens:abc", "max_tokens must be a positive integer"),  # was: a traceback
    ("min_tokens:abc", "min_tokens must be a non-negative integer"),  # was: a traceback
    ("max_tokens:0", "max_tokens must be a positive integer"),  # was: read as no limit
])
@pytest.mark.parametrize("command", ["sweep", "simulate"])
def test_virtual_runs_read_the_output_limits_alike(tmp_path, small_dataset, value, needle,
                                                   command):
    """``sweep --virtual`` and ``simulate`` read max_tokens / min_tokens with one function,
    before any run: one line, exit 2, nothing written."""
    args = (["simulate", small_dataset, "--request-count", 2] if command == "simulate" else
            ["sweep", "--input-file", small_dataset, "--virtual", "--concurrency", "1,2"])
    res = run(*args, "--extra-inputs", value, "-q", "--output-dir", "out", cwd=tmp_path,
              timeout=60)
    assert res.returncode == 2 and needle in one_error_line(res.stderr)
    assert listing(tmp_path) == []


BAD = os.fsdecode(b"b\xff")


@pytest.mark.parametrize("command", ["bench", "ab", "sweep", "simulate"])
def test_a_non_utf8_output_dir(tmp_path, small_dataset, command):
    data = [small_dataset] if command == "simulate" else ["--input-file", small_dataset]
    res = run(command, *data, "--request-count", 2, "-q", "--output-dir", BAD, cwd=tmp_path)
    assert res.returncode == 2 and "not valid UTF-8" in one_error_line(res.stderr)
    assert listing(tmp_path) == []  # was: a traceback and a stray folder


@pytest.mark.parametrize("labels,needle", [
    ((os.fsdecode(b"\xff\xfebad"), "ok"), "not valid UTF-8"),
    (("two\nlines", "ok"), "one line"),
    (("", "ok"), "one line"),
])
def test_labels_are_one_printable_line(tmp_path, two_runs, labels, needle):
    res = run("compare", two_runs / "ra", two_runs / "rb", "--labels", *labels, "--output-dir",
              "out", cwd=tmp_path)
    assert res.returncode == 2 and needle in one_error_line(res.stderr)
    assert listing(tmp_path) == []


def test_a_pipe_in_a_label_stays_in_its_cell(tmp_path, two_runs):
    res = run("compare", two_runs / "ra", two_runs / "rb", "--labels", "a|b", "B", "--output-dir",
              "out", cwd=tmp_path)
    assert res.returncode == 0, res.stderr
    head = (tmp_path / "out" / "comparison.md").read_text().splitlines()[0]
    assert head == "| Metric | a\\|b | B | Delta |"


@pytest.mark.parametrize("value", [",", " ", ",,"])
def test_an_empty_list_is_not_a_list(tmp_path, small_dataset, value):
    res = run("analyze", small_dataset, "--cache-gb", value, cwd=tmp_path)
    assert res.returncode == 2 and "takes numbers" in one_error_line(res.stderr)  # was: rc 0
