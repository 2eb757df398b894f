"""Class 3, resource limits: a full disk (a file-size limit, no root needed), long and
undecodable names, closed stdout, a file where a folder goes: one ``error:`` line, exit 1 for the
environment and 2 for bad input, and nothing left behind; exports are whole or absent."""
from __future__ import annotations

import os
import shutil

from .helpers import listing, one_error_line, run

TINY = ["--image-size", "64x48", "--image-content", "noise", "--image-format", "png",
        "--text-tokens", "8", "--tokenizer", "words", "-q"]


def test_disk_full_while_writing_images_is_one_line_exit_1_and_nothing_left(tmp_path):
    # every image is ~9 KB; a 6 KB file-size limit makes the first image write fail (EFBIG)
    res = run("pool", "-o", "p.jsonl", "-n", 200, "--pool-size", 100, *TINY, cwd=tmp_path,
              fsize=6000)
    assert res.returncode == 1, res.stderr
    assert "file too large" in one_error_line(res.stderr)
    assert listing(tmp_path) == []


def test_disk_full_while_writing_rows_leaves_nothing(tmp_path):
    res = run("pool", "-o", "p.jsonl", "-n", 400, "--pool-size", 5, *TINY, "--delivery",
              "data-url", cwd=tmp_path, fsize=50_000)
    assert res.returncode == 1 and "file too large" in one_error_line(res.stderr)
    assert listing(tmp_path) == []


def test_bench_export_on_a_full_disk_is_whole_or_absent(tmp_path, small_dataset):
    out = tmp_path / "out"
    res = run("bench", "--input-file", small_dataset, "--profile", "zero-delay", "--no-predict",
              "--request-count", 200, "--concurrency", 8, "-q", "--output-dir", out,
              cwd=tmp_path, fsize=30_000)  # the JSON (~6 KB) fits, records.jsonl (~80 KB) not
    assert res.returncode == 1 and "file too large" in one_error_line(res.stderr)
    assert listing(out) == []  # not the JSON without its records


def test_a_name_too_long_for_the_file_system(tmp_path):
    name = "x" * 244 + ".jsonl"  # 250 characters: the manifest's name would not fit
    res = run("pool", "-o", name, "-n", 5, "--pool-size", 5, *TINY, cwd=tmp_path)
    assert res.returncode == 2 and "too long" in one_error_line(res.stderr)
    assert listing(tmp_path) == []


def test_a_non_utf8_path(tmp_path):
    name = os.fsdecode(b"\xff\xfe.jsonl")
    res = run("pool", "-o", name, "-n", 5, "--pool-size", 5, *TINY, cwd=tmp_path)
    assert res.returncode == 2 and "not valid UTF-8" in one_error_line(res.stderr)
    assert listing(tmp_path) == []


def test_stdout_to_dev_full_is_one_line(tmp_path):
    with open("/dev/full", "w") as full:
        res = run("analyze", "--workload", "pool", "--cache-images", 10, cwd=tmp_path,
                  stdout=full)
    assert res.returncode == 1
    assert "cannot write to standard output" in one_error_line(res.stderr)


def test_hf_export_target_that_is_a_file(tmp_path):
    (tmp_path / "s_hf").write_text("not a folder")
    for force in ([], ["--force"]):
        res = run("pool", "-o", "s.jsonl", "-n", 5, "--pool-size", 5, *TINY, "--output-format",
                  "hf", *force, cwd=tmp_path)
        assert res.returncode == 2 and "is not a folder" in one_error_line(res.stderr)
    assert listing(tmp_path) == ["s_hf"]


def test_an_output_folder_that_is_a_file(tmp_path, small_dataset):
    (tmp_path / "out").write_text("x")
    res = run("bench", "--input-file", small_dataset, "--output-dir", tmp_path / "out",
              "--request-count", 1, "-q", cwd=tmp_path)
    assert res.returncode == 2 and "not a folder" in one_error_line(res.stderr)
    shutil.rmtree(tmp_path / "out", ignore_errors=True)
