"""Class 7, one exit-code policy for every command (``lifecycle.outcome``, applied by the CLI's
one error path): 143 SIGTERM, 130 Ctrl-C, 1 a failed run (every request failed) or the machine,
2 bad input. Real subprocesses and real signals."""
from __future__ import annotations

import errno
import json
import signal
from pathlib import Path

import pytest

from mmdatagen.errors import DatasetError, RunFailed, SpecError, UserError
from mmdatagen.lifecycle import StdoutError, Terminated, outcome

from .helpers import (
    STOP_BOUND_S,
    alive,
    children,
    kill_tree,
    listing,
    one_error_line,
    run,
    start,
    stop,
    survivors,
    wait_until,
)

ALL_FAIL = "--sim-arg=--fault-error-rate=1"  # the embedded simulator answers 500 to everything


@pytest.mark.parametrize("exc,code", [
    (KeyboardInterrupt(), 130), (Terminated(signal.SIGTERM), 143), (RunFailed("x"), 1),
    (UserError("x"), 2), (DatasetError("x"), 2), (SpecError("force", "is needed"), 2),
    (OSError(errno.ENOSPC, "full"), 1), (OSError(errno.ENOENT, "missing"), 2),
    (StdoutError(errno.EBADF, "closed"), 1),
])
def test_one_policy_maps_every_ending(exc, code):
    assert outcome(exc)[0] == code


def test_a_bug_is_not_mapped():
    assert outcome(TypeError("a bug keeps its traceback")) is None


def _embedded(proc) -> list[int]:
    return [p for p in children(proc.pid) if alive(p)]


def _load(command: str, dataset: Path) -> list:
    """A long run of ``command`` on the embedded simulator."""
    grid = (["--concurrency", "1,2", "--repeats", 1] if command == "sweep"
            else ["--concurrency", 2, "--grace-period", 1])
    return [command, "--input-file", dataset, "--request-count", 100000, "-q", "--output-dir",
            "out", *grid]


@pytest.mark.parametrize("command,sig,code", [
    ("bench", signal.SIGTERM, 143), ("bench", signal.SIGINT, 130),
    ("ab", signal.SIGTERM, 143), ("ab", signal.SIGINT, 130),
    ("sweep", signal.SIGTERM, 143),
])
def test_load_commands_exit_with_the_signal(tmp_path, small_dataset, command, sig, code):
    proc = start(*_load(command, small_dataset), cwd=tmp_path)
    try:
        wait_until(lambda: _embedded(proc) or proc.poll() is not None, 60, "the simulator")
        assert proc.poll() is None, proc.stderr.read().decode()
        sim = _embedded(proc)
        rc, seconds, err = stop(proc, sig)
    finally:
        kill_tree(proc)
    assert rc == code, err  # was: bench 130 for SIGTERM, ab and sweep 2 (bad input)
    assert "Traceback" not in err and "error:" not in err and seconds < STOP_BOUND_S
    assert survivors(sim) == []


def test_sweep_simulator_dies_with_a_sigkilled_sweep(tmp_path, small_dataset):
    proc = start(*_load("sweep", small_dataset), cwd=tmp_path)
    try:
        wait_until(lambda: _embedded(proc) or proc.poll() is not None, 60, "the simulator")
        sim = _embedded(proc)
        proc.kill()
        proc.wait()
        assert sim and survivors(sim) == []
    finally:
        kill_tree(proc)


@pytest.mark.parametrize("sig,code", [(signal.SIGTERM, 143), (signal.SIGINT, 130)])
def test_serve_exits_with_the_signal_and_removes_its_ready_file(tmp_path, sig, code):
    proc = start("serve", "--port", 0, "--profile", "zero-delay", "--ready-file", "ready.json",
                 cwd=tmp_path)
    try:
        assert "listening on" in proc.stdout.readline().decode()
        assert json.loads((tmp_path / "ready.json").read_text())["pid"] == proc.pid
        assert _embedded(proc) == []  # serve is the server: no child to leave behind
        rc, seconds, err = stop(proc, sig)
    finally:
        kill_tree(proc)
    assert rc == code and seconds < STOP_BOUND_S and "Traceback" not in err  # was: 0
    assert listing(tmp_path) == []  # was: a stale ready.json naming a dead server


@pytest.mark.parametrize("command", ["bench", "ab", "sweep"])
def test_a_run_whose_every_request_failed_exits_1(tmp_path, small_dataset, command):
    args = ["--input-file", small_dataset, "--request-count", 4, "-q", "--no-report",
            "--output-dir", "out"]
    if command == "ab":
        args += ["--a-sim-arg=--fault-error-rate=1"]
    else:
        args += [ALL_FAIL]
    if command == "sweep":
        args += ["--concurrency", "1,2", "--repeats", 1]
    res = run(command, *args, cwd=tmp_path)
    line = one_error_line(res.stderr)
    assert res.returncode == 1 and "every request failed" in line, res.stderr  # was: 0
    assert (tmp_path / "out").is_dir()  # the exports say what failed


def test_a_run_with_some_failures_still_passes(tmp_path, small_dataset):
    res = run("bench", "--input-file", small_dataset, "--request-count", 20, "-q", "--no-report",
              "--profile", "zero-delay", "--sim-arg=--fault-error-rate=0.3", "--output-dir", "out",
              cwd=tmp_path)
    assert res.returncode == 0, res.stderr


HF = ["pool", "-n", 3000, "--pool-size", 3000, "--image-size", "160x120", "--image-content",
      "noise", "-o", "h.jsonl", "--output-format", "hf", "--hf-parquet", "-q", "--workers", 2]


def _converting(folder: Path) -> bool:
    """The Hugging Face copy's work folder (``.h_hf.<random>/``, beside the lock file
    ``.h_hf.lock``) is there: the conversion runs."""
    return any(p.is_dir() for p in folder.glob(".h_hf.*"))


def test_hf_output_stopped_while_converting_leaves_nothing(tmp_path):
    proc = start(*HF, cwd=tmp_path)
    try:  # the JSONL is in place: the Hugging Face copy is being written
        wait_until(lambda: _converting(tmp_path) or proc.poll() is not None, 120,
                   "the conversion")
        proc.send_signal(signal.SIGSTOP)  # held where it is: the signal lands mid-conversion,
        assert _converting(tmp_path), proc.stderr.read().decode()  # not in the exit after it
        assert (tmp_path / "h.jsonl").exists()
        proc.send_signal(signal.SIGTERM)  # pending until it runs again
        rc, _, err = stop(proc, signal.SIGCONT)
    finally:
        kill_tree(proc)
    assert rc == 143 and "Traceback" not in err
    assert listing(tmp_path) == []  # was: h.jsonl, its manifest and h_images


def test_hf_output_on_a_full_disk_leaves_nothing(tmp_path):
    res = run("pool", "-n", 200, "--pool-size", 200, "--image-size", "160x120",
              "--image-content", "noise", "-o", "h.jsonl", "--output-format", "hf", "-q",
              cwd=tmp_path, fsize=2_000_000)  # every image fits, the arrow file does not
    assert res.returncode == 1 and "file too large" in one_error_line(res.stderr)
    assert listing(tmp_path) == []
