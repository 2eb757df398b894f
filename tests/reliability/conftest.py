"""Fixtures of the reliability suite."""
from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest


@pytest.fixture(scope="session")
def small_dataset(tmp_path_factory) -> Path:
    """200 requests over 50 small PNG files (path delivery), with its manifest."""
    folder = tmp_path_factory.mktemp("small")
    path = folder / "d.jsonl"
    subprocess.run([sys.executable, "-m", "mmdatagen", "pool", "-n", "200", "--pool-size", "50",
                    "--image-size", "64x48", "--image-content", "noise", "--image-format", "png",
                    "--text-tokens", "20", "--tokenizer", "words", "-o", str(path), "-q"],
                   check=True, timeout=120, capture_output=True)
    return path
