"""Properties of generation: sharded == unsharded for any split, same seed == same bytes, the
inline cache's budget never changes a byte."""
from __future__ import annotations

import tempfile
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from mmdatagen.content.audio import AudioStyle
from mmdatagen.content.images import ImageFactory, ImageStyle
from mmdatagen.content.inline import InlineCache, use_positions
from mmdatagen.content.text import TextEngine
from mmdatagen.content.tokenizers import get_tokenizer
from mmdatagen.content.video import VideoStyle
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


@settings(max_examples=200, deadline=None)
@given(rows=st.lists(st.lists(st.integers(0, 9), max_size=4), max_size=30),
       budget=st.integers(0, 40), batch=st.integers(1, 5))
def test_inline_cache_keeps_what_later_rows_use_within_its_budget(rows, budget, batch):
    positions = {k: [p for p, r in enumerate(rows) if k in r] for r in rows for k in r}
    uses = use_positions(rows)
    cache: InlineCache[int] = InlineCache(budget)
    done = 0
    for start in range(0, len(rows), batch):
        chunk = rows[start:start + batch]
        for key in dict.fromkeys(k for r in chunk for k in r):
            if key not in cache:  # what the pipeline renders for a batch
                cache.add(key, "x" * (key + 1))
        assert all(k in cache for r in chunk for k in r)  # every row of the batch can be written
        done += len(chunk)
        cache.evict(uses, done)
        assert cache.size == sum(len(v) for v in cache.payloads.values()) <= budget
        assert all(any(p >= done for p in positions[k]) for k in cache.payloads)


@pytest.mark.parametrize("delivery", ["data-url", "url"])
def test_inline_cache_budget_never_changes_the_bytes(executor, tmp_path, delivery):
    # a zero budget evicts every inline image, video and audio after each batch: they are
    # rendered again when used again, and the output must not change by one byte
    plan = pool_plan(num_requests=24, pool_size=5, images_per_request=2, image_size="16x12",
                     seed=3, videos_per_request=1, audios_per_request=1, video_size="16x16")
    styles = {"video": VideoStyle(frames=2), "audio": AudioStyle(duration=0.05)}
    written = []
    for mb in (0, 96):
        out = OutputSpec(path=tmp_path / str(mb) / "d.jsonl", quiet=True, workers=2, cache_mb=mb)
        result = generate(plan, ImageFactory(ImageStyle("noise", "png"), 3),
                          TextEngine(get_tokenizer("words"), 6, 3),
                          Delivery(delivery, image_dir=tmp_path / str(mb) / "img",
                                   base_url="http://h/x" if delivery == "url" else None,
                                   uuids=True),
                          out, {}, executor, media_styles=styles)
        written.append((result.path.read_bytes(), result.manifest.read_bytes()))
    assert written[0] == written[1]
