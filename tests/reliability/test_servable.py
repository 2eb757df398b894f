"""Class 13, the generator writes only what the engines can serve: an item setting vLLM's
Qwen-VL loaders or processors refuse (a one-frame video, an aspect ratio above 200) is refused
before anything is written, and what it does write is taken by analyze and the simulator."""
from __future__ import annotations

import json

import pytest

from .helpers import listing, one_error_line, run

VIDEO = ["pool", "-n", 4, "--pool-size", 2, "--images-per-request", 0, "--videos-per-request",
         1, "--video-size", "64x48", "--tokenizer", "words", "-q", "-o", "v.jsonl"]


@pytest.mark.parametrize("args,needle", [
    (["--video-frames", 1], "--video-frames makes 1-frame videos, which vLLM refuses"),
    (["--video-duration", 0.4, "--video-fps", 2], "--video-duration makes 1-frame videos"),
    (["--video-frames", 4, "--video-size", "4000x16"], "aspect ratio is above 200"),
])
def test_unservable_videos_are_refused(tmp_path, args, needle):
    res = run(*VIDEO, *args, cwd=tmp_path)
    assert res.returncode == 2  # was: exit 0, then analyze refused and the simulator said 400
    assert needle in one_error_line(res.stderr)
    assert listing(tmp_path) == []


def test_unservable_image_sizes_are_refused(tmp_path):
    res = run("pool", "-n", 4, "--pool-size", 2, "--image-size", "4000x16", "--tokenizer",
              "words", "-q", "-o", "i.jsonl", cwd=tmp_path)
    assert res.returncode == 2 and "aspect ratio is above 200" in one_error_line(res.stderr)
    assert listing(tmp_path) == []


def test_the_shortest_servable_video_is_served(tmp_path):
    assert run(*VIDEO, "--video-frames", 2, cwd=tmp_path).returncode == 0
    assert run("analyze", "v.jsonl", "--cache-gb", 1, cwd=tmp_path).returncode == 0
    res = run("simulate", "v.jsonl", "-q", "--profile", "zero-delay", "--output-dir", "s",
              cwd=tmp_path)
    assert res.returncode == 0, res.stderr
    export = json.loads((tmp_path / "s" / "profile_export_mmdatagen.json").read_text())
    assert export["error_request_count"]["avg"] == 0 and export["request_count"]["avg"] == 4
