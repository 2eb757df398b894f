"""Class 12, values from outside the spec layer are checked once, where they are read: dataset
rows (``io.readers``), manifests (``io.manifest``), exports given to compare (``loadgen.compare.
export_problem``), and the free-form flags (``--sim-param``, ``--extra-inputs``, ``--goodput``,
``--request-rate``, paths and labels). Each bad value: one line, exit 2, nothing written."""
from __future__ import annotations

import json
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
