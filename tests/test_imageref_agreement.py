"""One image identity and sizing service: the analysis, the simulator and the loader's
prediction group the same references into the same cache entries, with the same entry sizes,
for every key mode and every cache target."""
from __future__ import annotations

import base64
import io

import numpy as np
import pytest
from sim_helpers import fast_profile

from mmdatagen.analysis.trace import _Identifier
from mmdatagen.caches import get_target, target_names
from mmdatagen.io.imageref import KEY_MODES
from mmdatagen.io.readers import Turn
from mmdatagen.loadgen.payload import ImageEncoder
from mmdatagen.loadgen.predict import ImageTracker
from mmdatagen.sim.protocol import ImageResolver
from mmdatagen.vlm import get_model


def _png(seed: int, size=(96, 64)) -> bytes:
    from PIL import Image

    rng = np.random.default_rng(seed)
    buf = io.BytesIO()
    Image.fromarray(rng.integers(0, 256, (size[1], size[0], 3), dtype=np.uint8)).save(buf, "PNG")
    return buf.getvalue()


def _references(tmp_path):
    a, b, c, d = _png(1), _png(2, (320, 200)), _png(3, (700, 500)), _png(4)
    url = lambda data, mime="png": f"data:image/{mime};base64," + base64.b64encode(data).decode()  # noqa: E731
    (tmp_path / "c.png").write_bytes(c)
    (tmp_path / "c_copy.png").write_bytes(c)
    return [
        (url(a), None), (url(b), None), (url(a), None),        # a repeated
        (url(a, "jpeg"), None),                                 # same bytes, another mime head
        (url(d), "u-1"), (url(a), "u-1"),                       # one uuid on two pictures
        ("", "u-2"), ("", "u-1"),                               # cache-only references
        (str(tmp_path / "c.png"), None), (str(tmp_path / "c_copy.png"), None),
        ("http://img.example/x.png", None), ("http://img.example/x.png", "u-3"),
    ]


def _partition(keys) -> list[int]:
    first: dict = {}
    return [first.setdefault(k, len(first)) for k in keys]


@pytest.mark.parametrize("mode", KEY_MODES)
@pytest.mark.parametrize("target_name", target_names())
def test_every_consumer_agrees(tmp_path, mode, target_name):
    target = get_target(target_name)
    model = get_model("qwen3-vl-30b-a3b")
    refs = _references(tmp_path)
    if mode == "pixels":
        refs = [r for r in refs if not r[0].startswith("http")]  # nothing to decode
    # analysis
    ident = _Identifier(mode, tmp_path)
    a_ids = [ident(ref, uuid) for ref, uuid in refs]
    widths = np.array(ident.widths)
    heights = np.array(ident.heights)
    widths[widths == 0], heights[heights == 0] = 640, 480
    from mmdatagen.analysis.trace import Trace

    trace = Trace(np.array(a_ids), np.arange(len(a_ids)), len(a_ids), widths, heights)
    a_sizes, _ = trace.costs(model, target=target)
    # simulator (virtual runs read local paths; the HTTP server refuses them)
    prof = fast_profile().for_cache(target_name).with_overrides(key_mode=mode)
    resolver = ImageResolver(model, prof, allow_paths=True, dataset_dir=tmp_path)
    sims = [resolver.resolve(ref, uuid) for ref, uuid in refs]
    # the loader's prediction sees the wire form: local files encoded as AIPerf encodes them
    tracker = ImageTracker(model, prof.cache_target(), 1.0, ImageEncoder(tmp_path))
    loads = [tracker._key_size(tracker.encoder.url(ref) if ref else "", uuid)
             for ref, uuid in refs]

    expect = _partition(a_ids)
    assert _partition([s.key for s in sims]) == expect
    assert _partition([k for k, _ in loads]) == expect
    assert [s.nbytes for s in sims] == [int(a_sizes[i]) for i in a_ids]
    assert [size for _, size in loads] == [int(a_sizes[i]) for i in a_ids]
    # the rules themselves, not only agreement
    if mode == "uuid":
        assert expect[4] == expect[5] == expect[7] and expect[6] != expect[4]
    else:
        assert expect[4] not in expect[:4] and expect[5] == expect[0]
    if mode in ("bytes", "uuid"):
        assert expect[3] == expect[0]  # the encoded bytes decide, not the mime head
    if mode == "reference":
        assert expect[3] != expect[0]  # the string decides
    assert expect[8] == expect[9]  # equal files travel as equal data URLs: one entry


def test_loader_turn_keys_match_the_identifier(tmp_path):
    """``on_start`` (what bench calls) keys a turn's images like the analysis does."""
    refs = _references(tmp_path)[:4]
    tracker = ImageTracker(get_model("qwen3-vl-30b-a3b"), get_target("vllm-processor"), 1.0,
                           ImageEncoder(tmp_path))
    tracker.on_start(Turn(texts=["q"], images=[r for r, _ in refs]), None)
    keys = [k for k, _ in tracker.requests[0].items]
    assert _partition(keys) == [0, 1, 0, 0]
