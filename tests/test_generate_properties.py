"""Properties of generation: sharded == unsharded for any split, same seed == same bytes."""
from __future__ import annotations

import tempfile
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from mmdatagen.content.images import ImageFactory, ImageStyle
from mmdatagen.content.text import TextEngine
from mmdatagen.content.tokenizers import get_tokenizer
from mmdatagen.generate import Delivery, OutputSpec, generate, start_workers
from mmdatagen.plans import pool_plan, sliding_window_plan


@pytest.fixture(scope="module")
def executor():
    with start_workers(2) as pool:
        yield pool


def _write(plan, out_dir: Path, fmt: str, delivery: str, seed: int, executor, **shard) -> bytes:
    factory = ImageFactory(ImageStyle("noise", "png"), seed)
    texts = TextEngine(get_tokenizer("words"), 6, seed, 2)
    out = OutputSpec(path=out_dir / "d.jsonl", fmt=fmt, quiet=True, **shard)
    return generate(plan, factory, texts, Delivery(delivery, image_dir=out_dir / "img",
                                                   path_prefix="/data", uuids=True),
                    out, {}, executor).path.read_bytes()


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(kind=st.sampled_from(["pool", "sliding"]), rows=st.integers(1, 40), shards=st.integers(1, 7),
       fmt=st.sampled_from(["single_turn", "multi_turn"]), delivery=st.sampled_from(["path", "data-url"]),
       seed=st.integers(0, 3))
def test_any_split_concatenates_to_the_whole(executor, kind, rows, shards, fmt, delivery, seed):
    if kind == "pool":
        plan = pool_plan(num_requests=rows, pool_size=max(2, rows // 3), images_per_request=2,
                         image_size="8x6", seed=seed)
        fmt = "single_turn"
    else:
        plan = sliding_window_plan(users=1 + rows % 5, turns=1 + rows % 4, window=2,
                                   order="random", image_size="8x6", seed=seed)
    with tempfile.TemporaryDirectory() as tmp:
        whole = _write(plan, Path(tmp) / "whole", fmt, delivery, seed, executor)
        parts = b"".join(_write(plan, Path(tmp) / "parts", fmt, delivery, seed, executor,
                                shard_index=k, num_shards=shards) for k in range(shards))
    assert parts == whole


def test_sliding_window_same_seed_same_bytes(executor, tmp_path):
    plan = sliding_window_plan(users=3, turns=3, window=2, image_size="16x8", order="random")
    a = _write(plan, tmp_path / "a", "single_turn", "data-url", 5, executor)
    b = _write(plan, tmp_path / "b", "single_turn", "data-url", 5, executor)
    c = _write(plan, tmp_path / "c", "single_turn", "data-url", 6, executor)
    assert a == b != c
