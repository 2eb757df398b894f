"""AIPerf 0.13.0 loads mmdatagen's datasets unchanged, and sends the content mmdatagen's bench sends.

Each dataset (image + video + audio, every delivery, both generators, single_turn and multi_turn)
is loaded by AIPerf's own custom-dataset loader in AIPerf's own virtualenv (``setup_aiperf.py``);
every turn's content parts as AIPerf's chat endpoint renders them must equal the parts
``mmdatagen.loadgen.payload`` builds for the same turn, byte for byte (every URL and base64).
"""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from mmdatagen.io.readers import iter_turns
from mmdatagen.loadgen.payload import ImageEncoder, user_content

from . import setup_aiperf

HERE = Path(__file__).resolve().parent
AV = ["--videos-per-request", "1", "--audios-per-request", "1"]
MIXED = ["--images-per-request", "1", *AV]
CASES = {
    "pool-path": ["pool", "-n", "12", "--pool-size", "4", *MIXED],
    "pool-inline-webm-mp3": ["pool", "-n", "6", "--pool-size", "3", "--images-per-request", "2",
                             "--videos-per-request", "2", "--audios-per-request", "1",
                             "--delivery", "data-url", "--video-format", "webm",
                             "--audio-format", "mp3", "--image-uuids"],
    "pool-url": ["pool", "-n", "6", "--pool-size", "3", *MIXED, "--delivery", "url",
                 "--base-url", "http://media.example/m"],
    "sliding-window-single": ["sliding-window", "--users", "3", "--turns", "3", "--window", "2",
                              *AV],
    "sliding-window-multi": ["sliding-window", "--users", "2", "--turns", "3", "--window", "1",
                             *AV, "--format", "multi_turn", "--delivery", "data-url"],
}
SMALL = ["--image-size", "64x48", "--video-size", "128x96", "--video-frames", "4",
         "--audio-duration", "0.5", "--text-tokens", "12", "--tokenizer", "words", "-q", "-f"]


@pytest.fixture(scope="session")
def aiperf_python() -> Path:
    return setup_aiperf.ensure()


def _ours(path: Path) -> list:
    """Every turn's content as bench builds it, conversations in AIPerf's order (sessions by first
    appearance of their session_id, turns in file order)."""
    encoder = ImageEncoder()
    sessions: dict[str, list] = {}
    for i, turn in enumerate(iter_turns(path)):
        sessions.setdefault(turn.session_id or f"row-{i}", []).append(turn)
    return [user_content(t, encoder) for turns in sessions.values() for t in turns]


@pytest.mark.parametrize("name", sorted(CASES))
def test_aiperf_loads_and_renders_what_bench_sends(aiperf_python, tmp_path, monkeypatch, name):
    path = tmp_path / f"{name}.jsonl"
    subprocess.run([sys.executable, "-m", "mmdatagen", *CASES[name], *SMALL, "-o", str(path)],
                   check=True, cwd=tmp_path, capture_output=True)
    out = tmp_path / "aiperf-parts.json"
    proc = subprocess.run([str(aiperf_python), str(HERE / "aiperf_side.py"), str(path), str(out)],
                          capture_output=True, text=True, cwd=tmp_path,
                          env={**os.environ, "PYTHONPATH": ""})
    assert proc.returncode == 0, f"AIPerf could not load {name}:\n{proc.stderr[-3000:]}"
    theirs = json.loads(out.read_text())
    kinds = {p["type"] for parts in theirs for p in parts}
    assert {"text", "image_url", "video_url", "input_audio"} <= kinds
    monkeypatch.chdir(tmp_path)  # both sides resolve relative media paths from the working folder
    assert _ours(path) == theirs
