"""Class 10, standard output is an output: every write to it is checked (``lifecycle.
guard_standard_streams``). A short write (full disk, ``ulimit -f``) or a closed stdout is exit 1
with one line, never exit 0 with the text cut, never a traceback."""
from __future__ import annotations

import os
import resource
import subprocess

import orjson
import pytest

from .helpers import MMDATAGEN, one_error_line

BIG_JSON = ["analyze", "--workload", "pool", "--cache-images", "1:2000:1", "--json"]


def _run(args: list, cwd, fsize: int | None = None, close_stdout: bool = False,
         stdout=None) -> subprocess.CompletedProcess:
    def setup() -> None:
        if fsize is not None:
            resource.setrlimit(resource.RLIMIT_FSIZE, (fsize, fsize))
        if close_stdout:
            os.close(1)

    return subprocess.run([*MMDATAGEN, *map(str, args)], cwd=cwd, stdout=stdout,
                          stderr=subprocess.PIPE, text=True, timeout=120,
                          preexec_fn=setup)  # a limit, a closed stdout


def test_json_cut_short_by_a_file_size_limit_is_exit_1(tmp_path):
    whole = _run(BIG_JSON, tmp_path, stdout=subprocess.PIPE)
    assert whole.returncode == 0 and len(whole.stdout) > 40_000
    orjson.loads(whole.stdout)
    with open(tmp_path / "j.json", "w") as out:
        res = _run(BIG_JSON, tmp_path, fsize=20_480, stdout=out)
    assert res.returncode == 1  # was: 0 with 20480 bytes of invalid JSON
    assert "cannot write to standard output: file too large" in one_error_line(res.stderr)


def test_the_text_report_cut_short_is_exit_1(tmp_path):
    with open(tmp_path / "t.txt", "w") as out:
        res = _run(BIG_JSON[:-1], tmp_path, fsize=2_000, stdout=out)
    assert res.returncode == 1
    assert "cannot write to standard output" in one_error_line(res.stderr)


@pytest.mark.parametrize("args", [["--version"], ["analyze", "--workload", "pool",
                                                  "--cache-images", 10],
                                  ["pool", "-n", 3, "--pool-size", 3, "--image-size", "16x16",
                                   "--tokenizer", "words", "-q", "-o", "p.jsonl"]])
def test_a_closed_stdout_is_one_line_exit_1(tmp_path, args):
    res = _run(args, tmp_path, close_stdout=True)
    assert res.returncode == 1  # was: a traceback (sys.stdout is None)
    assert "standard output is closed" in one_error_line(res.stderr)


def test_a_closed_stdout_never_lends_its_number_to_an_output(tmp_path):
    """With fd 1 closed, the first file opened gets number 1: nothing printed may land in it."""
    _run(["pool", "-n", 3, "--pool-size", 3, "--image-size", "16x16", "--tokenizer", "words",
          "-o", "p.jsonl"], tmp_path, close_stdout=True)
    lines = (tmp_path / "p.jsonl").read_bytes().splitlines()
    assert len(lines) == 3 and all(orjson.loads(line)["text"] for line in lines)


def test_dev_full_is_exit_1(tmp_path):
    with open("/dev/full", "w") as full:
        res = _run(["--version"], tmp_path, stdout=full)
    assert res.returncode == 1 and "no space left" in one_error_line(res.stderr)
