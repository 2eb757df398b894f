"""Class 9, one writer per output folder: every command that writes a folder locks it for the
whole command (``io.atomic.output_lock``); a second run on it refuses with one line and leaves
the first run's files alone. Long names get their own lock (a hash of the whole name)."""
from __future__ import annotations

import signal

import pytest

from .helpers import kill_tree, listing, one_error_line, run, start, stop, wait_until

LONG = {"bench": ["--request-count", 100000, "--concurrency", 2],
        "ab": ["--request-count", 100000, "--concurrency", 2],
        "sweep": ["--request-count", 100000, "--concurrency", "1,2", "--repeats", 1],
        "simulate": ["--request-count", 100_000_000]}
SHORT = {"bench": ["--request-count", 2], "ab": ["--request-count", 2],
         "sweep": ["--request-count", 2, "--concurrency", 1, "--repeats", 1],
         "simulate": ["--request-count", 2]}


def _args(command: str, dataset, extra: list) -> list:
    data = [dataset] if command == "simulate" else ["--input-file", dataset]
    return [command, *data, *extra, "--output-dir", "out", "-q"]


@pytest.mark.parametrize("command", list(LONG))
def test_a_second_run_on_one_output_folder_refuses(tmp_path, small_dataset, command):
    first = start(*_args(command, small_dataset, LONG[command]), cwd=tmp_path)
    try:
        wait_until(lambda: (tmp_path / ".out.lock").exists() or first.poll() is not None, 60,
                   "the first run's lock")
        assert first.poll() is None, first.stderr.read().decode()
        second = run(*_args(command, small_dataset, SHORT[command]), cwd=tmp_path)
        assert first.poll() is None  # still running, untouched
        stop(first, signal.SIGTERM)
    finally:
        kill_tree(first)
    assert second.returncode == 2  # was: both exit 0, the last writer wins
    assert "another process is writing out" in one_error_line(second.stderr)


@pytest.mark.parametrize("length", [200, 217, 235])
def test_long_names_never_share_a_lock(tmp_path, length):
    """The JSONL and its image folder (``<name>_images``) share their first 200 characters:
    with the lock name cut at 200 characters the run blocked itself."""
    stem = "z" * (length - len(".jsonl"))
    res = run("pool", "-n", 3, "--pool-size", 3, "--image-size", "16x16", "--tokenizer", "words",
              "-q", "-o", f"{stem}.jsonl", cwd=tmp_path)
    assert res.returncode == 0, res.stderr  # was: "another process is writing ..._images"
    assert sorted(listing(tmp_path)) == sorted(
        [f"{stem}.jsonl", f"{stem}.jsonl.manifest.json", f"{stem}_images"]
        + [f"{stem}_images/{i:06d}.jpg" for i in range(3)])
