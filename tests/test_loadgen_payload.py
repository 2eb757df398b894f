"""Request bodies vs aiperf-compat.md, and the local-image encoding."""
from __future__ import annotations

import base64
import io

import pytest
from PIL import Image

from mmdatagen.errors import UserError
from mmdatagen.io.readers import Turn
from mmdatagen.loadgen.payload import (
    BodyConfig,
    ImageEncoder,
    build_body,
    coerce_value,
    parse_extra_inputs,
    parse_headers,
)

DATA = "data:image/png;base64,AAAA"


def test_single_text_is_a_plain_string():
    body = build_body(Turn(texts=["hi"]), BodyConfig(model="m"), ImageEncoder())
    assert body == {"model": "m", "messages": [{"role": "user", "content": "hi"}], "stream": False}
    assert list(body) == ["messages", "model", "stream"]  # AIPerf 0.13.0's key order


def test_texts_first_then_images_with_uuid_sibling():
    turn = Turn(texts=["a", "b"], images=[DATA, "http://x/y.jpg"], image_uuids=["u1", "u2"])
    content = build_body(turn, BodyConfig(model="m"), ImageEncoder())["messages"][0]["content"]
    assert [p["type"] for p in content] == ["text", "text", "image_url", "image_url"]
    assert content[2] == {"type": "image_url", "image_url": {"url": DATA}, "uuid": "u1"}
    assert content[3]["image_url"]["url"] == "http://x/y.jpg"


def test_one_text_with_image_is_a_list_and_no_uuid_key_without_uuids():
    content = build_body(Turn(texts=["a"], images=[DATA]), BodyConfig(model="m"),
                         ImageEncoder())["messages"][0]["content"]
    assert content == [{"type": "text", "text": "a"},
                       {"type": "image_url", "image_url": {"url": DATA}}]


def test_uuid_without_image_is_a_cache_only_reference():
    content = build_body(Turn(texts=["a"], image_uuids=["u"]), BodyConfig(model="m"),
                         ImageEncoder())["messages"][0]["content"]
    assert content[1] == {"type": "image_url", "image_url": {"url": ""}, "uuid": "u"}


def test_streaming_tokens_extra_inputs_then_row_extra_last():
    cfg = BodyConfig(model="m", streaming=True,
                     extra_inputs=parse_extra_inputs(["max_tokens:150", "ignore_eos:true",
                                                      "temperature:0.5", "stop:abc"]))
    turn = Turn(texts=["q"], output_length=42, extra={"temperature": 0.1, "seed": 3})
    body = build_body(turn, cfg, ImageEncoder())
    assert body["stream"] is True
    assert body["stream_options"] == {"include_usage": True}
    assert body["max_completion_tokens"] == 42
    assert body["max_tokens"] == 150 and body["ignore_eos"] is True and body["stop"] == "abc"
    assert body["temperature"] == 0.1 and body["seed"] == 3  # per-row extra wins, merged last
    assert list(body) == ["messages", "model", "stream", "max_completion_tokens", "max_tokens",
                          "ignore_eos", "temperature", "stop", "seed", "stream_options"]
    cfg.extra_inputs["stream_options"] = {"include_usage": False}
    assert build_body(turn, cfg, ImageEncoder())["stream_options"] == {"include_usage": False}


def test_non_streaming_has_no_stream_options_and_legacy_max_tokens():
    cfg = BodyConfig(model="m", legacy_max_tokens=True)
    body = build_body(Turn(texts=["q"], output_length=5), cfg, ImageEncoder())
    assert "stream_options" not in body and body["max_tokens"] == 5


def test_coercion_and_bad_pairs():
    assert coerce_value("150") == 150 and isinstance(coerce_value("150"), int)
    assert coerce_value("1.5") == 1.5
    assert coerce_value("True") is True and coerce_value("false") is False
    assert coerce_value('["a"]') == ["a"]
    assert coerce_value("text") == "text"
    assert parse_extra_inputs(['{"a": {"b": 1}}']) == {"a": {"b": 1}}
    with pytest.raises(UserError):
        parse_extra_inputs(["novalue"])
    with pytest.raises(UserError):
        parse_headers(["nocolon"])
    assert parse_headers(["X-A: 1:2"]) == {"X-A": "1:2"}


def test_completions_endpoint_uses_prompt():
    body = build_body(Turn(texts=["a", "b"]), BodyConfig(model="m", endpoint_type="completions"),
                      ImageEncoder())
    assert body["prompt"] == "a b" and "messages" not in body


def _noise(mode="RGB", size=(32, 24)):
    import numpy as np

    arr = np.random.default_rng(1).integers(0, 256, (size[1], size[0], 3), dtype=np.uint8)
    return Image.fromarray(arr, "RGB").convert(mode)


def test_local_files_encoded_like_aiperf_once_per_file(tmp_path):
    img = _noise()
    img.save(tmp_path / "a.png")
    img.save(tmp_path / "b.jpg", quality=95)
    enc = ImageEncoder(tmp_path)
    urls = [enc.url(str(tmp_path / "a.png")) for _ in range(3)]
    assert enc.encoded == 1 and len(set(urls)) == 1
    expect = io.BytesIO()
    Image.open(tmp_path / "a.png").save(expect, format="PNG", compress_level=6)
    assert urls[0] == "data:image/png;base64," + base64.b64encode(expect.getvalue()).decode()
    jurl = enc.url(str(tmp_path / "b.jpg"))
    expect = io.BytesIO()
    Image.open(tmp_path / "b.jpg").save(expect, format="JPEG", quality=85, subsampling=0)
    assert jurl == "data:image/jpeg;base64," + base64.b64encode(expect.getvalue()).decode()
    assert enc.encoded == 2


def test_other_formats_and_missing_files_are_user_errors(tmp_path):
    _noise().save(tmp_path / "a.gif")
    with pytest.raises(UserError, match="only PNG and JPEG"):
        ImageEncoder().url(str(tmp_path / "a.gif"))
    with pytest.raises(UserError):
        ImageEncoder().url(str(tmp_path / "missing.png"))


def test_concurrent_threads_encode_each_file_once(tmp_path):
    from concurrent.futures import ThreadPoolExecutor

    _noise(size=(400, 300)).save(tmp_path / "a.png")
    enc = ImageEncoder(tmp_path)
    with ThreadPoolExecutor(8) as pool:
        urls = list(pool.map(lambda _: enc.url(str(tmp_path / "a.png")), range(16)))
    assert len(set(urls)) == 1 and enc.encoded == 1
