"""The request parser never fails with anything but a client error (never crashes on input)."""
from __future__ import annotations

import orjson
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from sim_helpers import MODEL, fast_profile, png_url

from mmdatagen.sim.protocol import ImageResolver, RequestError, parse_body
from mmdatagen.vlm import get_model

PROFILE = fast_profile()
RESOLVER = ImageResolver(get_model(PROFILE.model), PROFILE)
MODELS = frozenset({MODEL})
IMG = png_url(size=(40, 30))

json_values = st.recursive(
    st.none() | st.booleans() | st.integers(-2**40, 2**40) | st.floats(allow_nan=False)
    | st.text(max_size=20) | st.sampled_from([IMG, "data:image/png;base64,xx", "https://a/b", "",
                                              "data:video/mp4;base64,AAAA", "wav", "UklGRg=="]),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(
        st.sampled_from(["type", "text", "image_url", "url", "uuid", "role", "content", "data",
                         "format"]),
        inner, max_size=4),
    max_leaves=12)

parts = st.fixed_dictionaries({"type": st.sampled_from(["text", "image_url", "video_url",
                                                       "input_audio", 3])},
                              optional={"text": json_values, "image_url": json_values,
                                        "video_url": json_values, "input_audio": json_values,
                                        "uuid": json_values})
bodies = st.fixed_dictionaries(
    {"model": st.sampled_from([MODEL, "other", 5, None])},
    optional={"messages": st.lists(st.fixed_dictionaries(
                  {"role": st.sampled_from(["user", "assistant", 1])},
                  optional={"content": st.one_of(json_values, st.lists(parts, max_size=3))}),
                  max_size=3) | json_values,
              "prompt": json_values, "stream": json_values, "stream_options": json_values,
              "max_tokens": json_values, "max_completion_tokens": json_values,
              "min_tokens": json_values, "ignore_eos": json_values, "n": json_values})


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(body=bodies, kind=st.sampled_from(["chat", "completions"]))
def test_parser_only_raises_client_errors(body, kind):
    try:
        parsed = parse_body(orjson.dumps(body), kind, PROFILE, RESOLVER, MODELS)
    except RequestError as exc:
        assert 400 <= exc.status < 500
        return
    assert parsed.target_tokens >= 1 and parsed.prompt_tokens >= 0


@settings(max_examples=200, deadline=None)
@given(raw=st.binary(max_size=200))
def test_parser_survives_arbitrary_bytes(raw):
    try:
        parse_body(raw, "chat", PROFILE, RESOLVER, MODELS)
    except RequestError:
        pass
