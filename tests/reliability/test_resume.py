"""Class 11, resume trusts nothing: a sweep folder records what it was made from (dataset
digest, target, every run setting, the runs it finished: ``sweep.origin.json``); a rerun resumes
only that sweep's runs, anything else is refused with one line naming --force."""
from __future__ import annotations

import csv
import io
import shutil
import signal

import orjson

from .helpers import kill_tree, one_error_line, run, start, stop, wait_until

GRID = ["--virtual", "--profile", "zero-delay", "-q", "--output-dir", "sw"]


def _sweep(tmp_path, dataset, *extra, count=12, concurrency="1,2", repeats=1):
    return run("sweep", "--input-file", dataset, "--request-count", count, "--concurrency",
               concurrency, "--repeats", repeats, *GRID, *extra, cwd=tmp_path)


def _resumed(tmp_path) -> list[str]:
    rows = csv.DictReader(io.StringIO((tmp_path / "sw" / "sweep.csv").read_text()))
    return [r["resumed"] for r in rows]


def _origin(tmp_path) -> bytes:
    try:
        return (tmp_path / "sw" / "sweep.origin.json").read_bytes()
    except OSError:
        return b""


def test_a_rerun_with_other_settings_or_data_is_refused(tmp_path, small_dataset):
    assert _sweep(tmp_path, small_dataset).returncode == 0
    before = (tmp_path / "sw" / "sweep.json").read_bytes()
    other = tmp_path / "other.jsonl"
    shutil.copy(small_dataset, other)
    with open(other, "ab") as fh:
        fh.write(b'{"text": "one more row"}\n')
    for res, needle in ((_sweep(tmp_path, small_dataset, count=6), "request_count 12, now 6"),
                        (_sweep(tmp_path, other), "another dataset")):
        assert res.returncode == 2  # was: every run "resumed", the old numbers reported, 0
        line = one_error_line(res.stderr)
        assert needle in line and "--force" in line
    assert (tmp_path / "sw" / "sweep.json").read_bytes() == before
    # the same sweep resumes every run; more points and repeats resume the shared ones
    assert _sweep(tmp_path, small_dataset).returncode == 0
    assert _resumed(tmp_path) == ["True", "True"]
    res = _sweep(tmp_path, small_dataset, concurrency="1,2,4", repeats=2)
    assert res.returncode == 0, res.stderr
    assert _resumed(tmp_path).count("True") == 2


def test_force_runs_again_and_leftovers_are_never_resumed(tmp_path, small_dataset):
    assert _sweep(tmp_path, small_dataset, concurrency="1,2,4").returncode == 0
    assert _sweep(tmp_path, small_dataset, "--force", count=6).returncode == 0
    assert _resumed(tmp_path) == ["False", "False"]
    # concurrency-4 is a leftover of the 12-request sweep: run again, not resumed
    res = _sweep(tmp_path, small_dataset, count=6, concurrency="1,2,4")
    assert res.returncode == 0, res.stderr
    assert _resumed(tmp_path) == ["True", "True", "False"]
    doc = orjson.loads((tmp_path / "sw" / "sweep.json").read_bytes())
    assert {r["request_count"] for p in doc["points"] for r in p["runs"]} == {6}


def test_runs_without_an_origin_are_not_resumed(tmp_path, small_dataset):
    assert _sweep(tmp_path, small_dataset).returncode == 0
    (tmp_path / "sw" / "sweep.origin.json").unlink()
    res = _sweep(tmp_path, small_dataset)
    assert res.returncode == 2 and "--force" in one_error_line(res.stderr)


def test_a_stopped_sweep_resumes_its_finished_runs(tmp_path, small_dataset):
    args = ["sweep", "--input-file", small_dataset, "--concurrency", "1,2", "--repeats", 1,
            "--request-count", 30, "--profile", "zero-delay", "--output-dir", "sw"]
    proc = start(*args, "--extra-inputs", "max_tokens:2000", cwd=tmp_path)
    try:  # stopped in the second run, once the first one is recorded as finished
        wait_until(lambda: b"concurrency-1/r1" in _origin(tmp_path) or proc.poll() is not None,
                   120, "the first run")
        rc, _, err = stop(proc, signal.SIGTERM)
    finally:
        kill_tree(proc)
    assert rc == 143, err
    res = run(*args, "--extra-inputs", "max_tokens:2000", "-q", cwd=tmp_path)
    assert res.returncode == 0, res.stderr
    assert _resumed(tmp_path) == ["True", "False"]
