"""Class 8, outputs over inputs: one check (``io.atomic.check_not_input``) for every file a
command writes, made before any work and again by every write of ``io.atomic``; compare
needs --force over existing files. The same file under another name (a hard link) counts."""
from __future__ import annotations

import os
import shutil
from pathlib import Path

import pytest

from .helpers import one_error_line, run

FAST = ["--profile", "zero-delay", "-q"]


def _refused(res, needle: str = "is an input of this run") -> None:
    assert res.returncode == 2, res.stderr
    assert needle in one_error_line(res.stderr)


def _copy(src: Path, dst: Path) -> bytes:
    dst.parent.mkdir(parents=True, exist_ok=True)
    shutil.copy(src, dst)
    return dst.read_bytes()


def test_simulate_never_writes_over_its_dataset(tmp_path, small_dataset):
    before = _copy(small_dataset, tmp_path / "bo" / "records.jsonl")
    res = run("simulate", "bo/records.jsonl", "--output-dir", "bo", *FAST, cwd=tmp_path)
    _refused(res)  # was: the dataset replaced by the records
    assert (tmp_path / "bo" / "records.jsonl").read_bytes() == before


@pytest.mark.parametrize("name", ["sweep.csv", "concurrency-2_max_running-4/r1/records.jsonl",
                                  "profiles/concurrency-2_max_running-4.yaml", "report.html"])
def test_sweep_never_writes_over_its_dataset(tmp_path, small_dataset, name):
    before = _copy(small_dataset, tmp_path / "sw" / name)
    res = run("sweep", "--input-file", Path("sw") / name, "--virtual", "--concurrency", 2,
              "--repeats", 1, "--request-count", 5, "--sim-param", "max_running=4",
              "--output-dir", "sw", *FAST, cwd=tmp_path)
    _refused(res)
    assert (tmp_path / "sw" / name).read_bytes() == before


def test_bench_never_writes_its_report_over_its_dataset(tmp_path, small_dataset):
    before = _copy(small_dataset, tmp_path / "b" / "report.html")
    res = run("bench", "--input-file", "b/report.html", "--output-dir", "b",
              "--request-count", 2, *FAST, cwd=tmp_path)
    _refused(res)  # was: the dataset replaced by the HTML report, exit 0
    assert (tmp_path / "b" / "report.html").read_bytes() == before


def test_a_hard_link_is_the_same_input(tmp_path, small_dataset):
    before = _copy(small_dataset, tmp_path / "d.jsonl")
    (tmp_path / "b").mkdir()
    os.link(tmp_path / "d.jsonl", tmp_path / "b" / "records.jsonl")
    res = run("bench", "--input-file", "d.jsonl", "--output-dir", "b", "--request-count", 2,
              *FAST, cwd=tmp_path)
    _refused(res, "the same file as d.jsonl")
    assert (tmp_path / "d.jsonl").read_bytes() == before


def test_compare_into_a_run_folder_needs_force(tmp_path, small_dataset):
    for name in ("ra", "rb"):
        assert run("bench", "--input-file", small_dataset, "--request-count", 3, "--output-dir",
                   name, *FAST, cwd=tmp_path).returncode == 0
    report = (tmp_path / "rb" / "report.html").read_bytes()
    res = run("compare", "ra", "rb", "--output-dir", "rb", cwd=tmp_path)
    _refused(res, "--force is needed: rb/report.html exists")  # was: overwritten
    assert (tmp_path / "rb" / "report.html").read_bytes() == report
    assert run("compare", "ra", "rb", "--output-dir", "rb", "--force",
               cwd=tmp_path).returncode == 0
    # the export itself is an input: no --force writes over it
    export = tmp_path / "rb" / "profile_export_mmdatagen.json"
    (tmp_path / "rb" / "comparison.json").unlink()
    os.link(export, tmp_path / "rb" / "comparison.json")
    before = export.read_bytes()
    res = run("compare", "ra", "rb", "--output-dir", "rb", "--force", cwd=tmp_path)
    _refused(res)
    assert export.read_bytes() == before


def test_pool_never_swaps_away_its_image_source(tmp_path, small_dataset):
    src = tmp_path / "src"
    shutil.copytree(small_dataset.parent / "d_images", src)
    count = len(list(src.iterdir()))
    for image_dir in ("src", "."):  # the folder itself, or a folder holding it
        res = run("pool", "-n", 5, "--pool-size", 3, "--image-content", "folder",
                  "--image-source-dir", "src", "--image-dir", image_dir, "--force", "-o",
                  "p.jsonl", "--tokenizer", "words", "-q", cwd=tmp_path)
        _refused(res, "an input of this run")
        assert len(list(src.iterdir())) == count
    assert not (tmp_path / "p.jsonl").exists()


def test_serve_ready_file_is_not_its_profile(tmp_path):
    profile = Path(__file__).resolve().parents[2] / "configs" / "profiles" / "zero-delay.yaml"
    mine = tmp_path / "p.yaml"
    before = _copy(profile, mine)
    res = run("serve", "--port", 0, "--profile", mine, "--ready-file", mine, cwd=tmp_path,
              timeout=60)
    _refused(res)
    assert mine.read_bytes() == before


def test_merge_never_writes_over_a_shard(tmp_path):
    for k in (0, 1):
        assert run("pool", "-n", 6, "--pool-size", 3, "--image-size", "16x16", "--tokenizer",
                   "words", "-q", "--delivery", "data-url", "--num-shards", 2, "--shard-index",
                   k, "-o", "d.jsonl", cwd=tmp_path).returncode == 0
    shard = tmp_path / "d.shard-00000-of-00002.jsonl"
    before = shard.read_bytes()
    os.link(shard, tmp_path / "alias.jsonl")
    res = run("merge", "-o", "alias.jsonl", "--force", *[p.name for p in
              sorted(tmp_path.glob("d.shard-*.jsonl"))], cwd=tmp_path)
    _refused(res)
    assert shard.read_bytes() == before


def test_pool_never_writes_over_its_config(tmp_path):
    """``pool --config X.yaml -o X.yaml --force``: the preset is an input of the run (it was
    replaced by the dataset, exit 0)."""
    preset = tmp_path / "X.yaml"
    preset.write_text("num_requests: 4\npool_size: 2\nimage_size: 32x32\ntext_tokens: 8\n")
    before = preset.read_bytes()
    res = run("pool", "--config", "X.yaml", "-o", "X.yaml", "--force", "-q", cwd=tmp_path)
    _refused(res)
    assert preset.read_bytes() == before
    ok = run("pool", "--config", "X.yaml", "-o", "d.jsonl", "-q", cwd=tmp_path)
    assert ok.returncode == 0, ok.stderr  # the preset still works as one
