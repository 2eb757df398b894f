"""Seed-A-shaped datasets for the simulator's tests and its calibration benchmark, written by
the real generator (``mmdatagen.dataset.make_dataset``, the library call behind ``mmdatagen
pool``): the seeds' pool rule, exact text token counts (Qwen3-VL's tokenizer, which the
profile's calibration measured), solid-colour JPEGs (pixel-distinct per pool id, cheap to
encode) inline as data URLs, so a dataset is one self-contained JSONL.

``benchmarks/bench_sim_seed_a.py`` imports this module too (it puts ``tests/`` on its path).
"""
from __future__ import annotations

from pathlib import Path


def write_pool_dataset(path: Path, num_requests: int = 1000, pool_size: int = 200,
                       size: tuple[int, int] = (640, 480), text_tokens: int = 400,
                       seed: int = 0) -> Path:
    """``mmdatagen pool -n N --pool-size P --image-size WxH --text-tokens T --seed S
    --image-content solid --delivery data-url``; returns the JSONL path
    (its manifest is written beside it)."""
    from mmdatagen.dataset import make_dataset
    from mmdatagen.settings.base import validate
    from mmdatagen.settings.content import Content, Output
    from mmdatagen.settings.workload import PoolWorkload

    workload = validate(PoolWorkload(num_requests=num_requests, pool_size=pool_size))
    content = validate(Content(text_tokens=text_tokens, image_size=f"{size[0]}x{size[1]}",
                               image_content="solid", delivery="data-url"))
    output = validate(Output(seed=seed, output=str(path), quiet=True, force=True, workers=1))
    return make_dataset(workload, content, output).path


def write_sliding_dataset(path: Path, users: int = 30, turns: int = 8, window: int = 5,
                          size: tuple[int, int] = (2400, 1080), text_tokens: int = 8000,
                          seed: int = 0) -> Path:
    """Seed B's shape: ``mmdatagen sliding-window --users U --turns T --window W --image-size
    WxH --text-tokens N --seed S --image-content solid`` (turn-major rows with ``session_id``,
    base64 data URLs; solid colours keep the 360 images small: the simulator prices an image
    by its size, not its bytes); returns the JSONL path."""
    from mmdatagen.dataset import make_dataset
    from mmdatagen.settings.base import validate
    from mmdatagen.settings.content import SLIDING_WINDOW_CONTENT, Content, Output
    from mmdatagen.settings.workload import SlidingWindowWorkload

    workload = validate(SlidingWindowWorkload(users=users, turns=turns, window=window))
    content = validate(Content(**{**SLIDING_WINDOW_CONTENT, "text_tokens": text_tokens,
                                  "image_size": f"{size[0]}x{size[1]}",
                                  "image_content": "solid", "delivery": "data-url"}))
    output = validate(Output(seed=seed, output=str(path), quiet=True, force=True, workers=1))
    return make_dataset(workload, content, output).path
