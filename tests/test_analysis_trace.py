"""Traces from AIPerf datasets (engine keying, paths, sessions) and from manifests."""
import base64
import io
import json

import numpy as np
import pytest
from PIL import Image

from mmdatagen.analysis.trace import trace_from_dataset, trace_from_manifest
from mmdatagen.errors import DatasetError, UserError
from mmdatagen.io.manifest import Manifest
from mmdatagen.vlm import get_model


def _png(color, size=(64, 48), level=6) -> bytes:
    buf = io.BytesIO()
    Image.new("RGB", size, color).save(buf, "PNG", compress_level=level)
    return buf.getvalue()


def _url(data: bytes, mime="png") -> str:
    return f"data:image/{mime};base64," + base64.b64encode(data).decode()


def _write(path, rows):
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


def _objects(trace):
    return trace.ids.tolist()


def test_key_modes_on_data_urls(tmp_path):
    red0, red9, blue = _png("red", level=0), _png("red", level=9), _png("blue")
    assert red0 != red9
    rows = [{"text": "a", "image": _url(red0)}, {"text": "b", "image": _url(red9)},
            {"text": "c", "image": _url(red0)}, {"text": "d", "images": [_url(blue), _url(red0)]}]
    path = _write(tmp_path / "d.jsonl", rows)
    assert _objects(trace_from_dataset(path, "bytes")) == [0, 1, 0, 2, 0]
    assert _objects(trace_from_dataset(path, "pixels")) == [0, 0, 0, 1, 0]
    assert _objects(trace_from_dataset(path, "reference")) == [0, 1, 0, 2, 0]
    t = trace_from_dataset(path, "bytes")
    assert t.ref_row.tolist() == [0, 1, 2, 3, 3] and t.num_rows == 4
    assert t.widths.tolist() == [64, 64, 64] and t.heights.tolist() == [48, 48, 48]
    assert t.sessions is None


def test_reference_mode_distinguishes_mime_but_bytes_does_not(tmp_path):
    data = _png("green")
    path = _write(tmp_path / "d.jsonl", [{"image": _url(data, "png")},
                                         {"image": _url(data, "jpeg")}])
    assert _objects(trace_from_dataset(path, "bytes")) == [0, 0]
    assert _objects(trace_from_dataset(path, "reference")) == [0, 1]


def test_paths_resolve_against_cwd_then_dataset_folder(tmp_path, monkeypatch):
    ds = tmp_path / "ds"
    ds.mkdir()
    (ds / "a.png").write_bytes(_png("red", (100, 50)))
    (ds / "copy.png").write_bytes(_png("red", (100, 50)))
    other = tmp_path / "cwd"
    other.mkdir()
    (other / "a.png").write_bytes(_png("blue", (30, 20)))
    path = _write(ds / "d.jsonl", [{"image": "a.png"}, {"image": "copy.png"},
                                   {"image": _url(_png("red", (100, 50)))}])
    monkeypatch.chdir(tmp_path)
    t = trace_from_dataset(path, "bytes")  # no a.png in cwd: the dataset's folder
    assert t.widths[0] == 100
    # equal files share a key; a data URL of the same bytes does not (files are re-encoded)
    assert _objects(t) == [0, 0, 1]
    monkeypatch.chdir(other)
    t = trace_from_dataset(path, "bytes")  # AIPerf resolves against the working directory first
    assert (t.widths[0], t.heights[0]) == (30, 20)
    assert _objects(t) == [0, 1, 2]


def test_missing_file_and_bad_base64_are_located_dataset_errors(tmp_path):
    path = _write(tmp_path / "d.jsonl", [{"image": "nope.png"}])
    with pytest.raises(DatasetError, match=r"d.jsonl:1: .*nope.png"):
        trace_from_dataset(path)
    path = _write(tmp_path / "e.jsonl", [{"text": "x"}, {"image": "data:image/png;base64,@@@"}])
    with pytest.raises(DatasetError, match=r"e.jsonl:2: .*base64"):
        trace_from_dataset(path)


def test_multi_turn_requests_resend_history(tmp_path):
    a, b, c = _url(_png("red")), _url(_png("blue")), _url(_png("green"))
    rows = [{"session_id": "s1", "turns": [{"image": a}, {"image": b}]},
            {"session_id": "s2", "turns": [{"image": c}]}]
    t = trace_from_dataset(_write(tmp_path / "m.jsonl", rows))
    assert _objects(t) == [0, 0, 1, 2] and t.ref_row.tolist() == [0, 1, 1, 2]
    assert t.sessions.tolist() == [0, 0, 1]


def test_single_turn_sessions_are_kept(tmp_path):
    a = _url(_png("red"))
    rows = [{"session_id": "u1", "image": a}, {"session_id": "u2", "image": a},
            {"session_id": "u1", "text": "no image"}]
    t = trace_from_dataset(_write(tmp_path / "s.jsonl", rows))
    assert t.sessions.tolist() == [0, 1, 0]
    assert t.num_rows == 3 and t.ref_row.tolist() == [0, 1]


def test_uuid_mode_and_cache_only_references(tmp_path):
    a, b = _url(_png("red", (640, 480))), _url(_png("blue"))
    rows = [{"images": [a], "image_uuids": ["u-1"]},
            {"images": [b], "image_uuids": ["u-1"]},   # same uuid, other picture: one entry
            {"image_uuids": ["u-1"], "text": "cache-only"},
            {"images": [a]}]                           # no uuid: falls back to the bytes
    t = trace_from_dataset(_write(tmp_path / "u.jsonl", rows), "uuid")
    assert _objects(t) == [0, 0, 0, 1]
    assert (t.widths[0], t.heights[0]) == (640, 480)
    keyed_by_bytes = trace_from_dataset(_write(tmp_path / "v.jsonl", rows[:2] + rows[3:]), "bytes")
    assert _objects(keyed_by_bytes) == [0, 1, 0]


def test_http_urls_need_a_size_for_token_models(tmp_path):
    rows = [{"image": "https://example.com/a.jpg"}, {"image": "https://example.com/a.jpg"}]
    t = trace_from_dataset(_write(tmp_path / "h.jsonl", rows))
    assert _objects(t) == [0, 0]
    model = get_model("qwen3-vl-30b-a3b")
    with pytest.raises(UserError, match="url_image_size WxH is needed"):
        t.costs(model)
    sizes, tokens = t.costs(model, unknown_size=(640, 480))
    assert tokens.tolist() == [300] and sizes.tolist() == [300 * 4096]


def test_manifest_trace_uses_ids_and_sessions_without_reading_images(tmp_path):
    manifest = {"kind": "sliding-window", "format": "single_turn", "params": {"users": 2},
                "images": [{"id": 7, "ref": "/nonexistent/7.png", "width": 2400, "height": 1080},
                           {"id": 3, "ref": None, "width": 512, "height": 512}],
                "rows": [[7, 3], [3], []], "sessions": ["user_1", "user_0", "user_1"],
                "image_uuids": None}
    t = trace_from_manifest(Manifest.from_dict(manifest), "m")
    assert _objects(t) == [0, 1, 1] and t.ref_row.tolist() == [0, 0, 1]
    assert t.num_rows == 3 and t.sessions.tolist() == [0, 1, 0]
    assert t.widths.tolist() == [2400, 512]
    multi = Manifest.from_dict(dict(manifest, format="multi_turn"))
    assert _objects(trace_from_manifest(multi)) == [0, 1, 1, 0, 1]


def test_malformed_manifest_is_a_dataset_error():
    with pytest.raises(DatasetError, match="malformed manifest"):
        Manifest.from_dict({"images": [{"id": 1}], "rows": [[1]]})
    with pytest.raises(DatasetError, match="sessions"):
        Manifest.from_dict({"images": [], "rows": [[]], "sessions": ["a", "b"]})
    with pytest.raises(DatasetError, match="malformed manifest"):
        trace_from_manifest(Manifest.from_dict({"images": [], "rows": [[5]]}))


def test_reordered_trace_follows_rows():
    from mmdatagen.analysis.trace import Trace
    t = Trace(np.array([0, 1, 2, 0]), np.array([0, 0, 1, 2]), 3, np.ones(3), np.ones(3),
              np.array([5, 6, 5]))
    r = t.reordered(np.array([2, 0, 1]))
    assert r.ids.tolist() == [0, 0, 1, 2] and r.ref_row.tolist() == [0, 1, 1, 2]
    assert r.sessions.tolist() == [5, 5, 6]


def test_non_canonical_base64_of_the_same_bytes_is_the_same_key(tmp_path):
    data = _png("red")
    data += b"\0" * ((1 - len(data)) % 3)  # trailing bytes after IEND: length = 1 mod 3, "=="
    text = base64.b64encode(data).decode()
    assert text.endswith("==")
    stray = text[:-3] + chr(ord(text[-3]) + 1) + "=="  # non-zero trailing bits, same bytes
    wrapped = "\n".join(text[i:i + 76] for i in range(0, len(text), 76))
    assert base64.b64decode(stray) == data
    rows = [{"image": "data:image/png;base64," + t} for t in (text, stray, text)]
    path = _write(tmp_path / "d.jsonl", rows)
    assert _objects(trace_from_dataset(path, "bytes")) == [0, 0, 0]
    assert _objects(trace_from_dataset(path, "reference")) == [0, 1, 0]
    bad = _write(tmp_path / "w.jsonl", [{"image": "data:image/png;base64," + wrapped}])
    with pytest.raises(DatasetError, match="base64"):
        trace_from_dataset(bad)  # AIPerf sends it untouched; servers reject line breaks too


def test_dimensions_behind_a_long_jpeg_header(tmp_path):
    buf = io.BytesIO()
    Image.new("RGB", (123, 45), "blue").save(buf, "JPEG", comment=b"x" * 60_000)
    assert len(buf.getvalue()) > 60_000
    path = _write(tmp_path / "j.jsonl", [{"image": _url(buf.getvalue(), "jpeg")}])
    t = trace_from_dataset(path)
    assert (t.widths[0], t.heights[0]) == (123, 45)


def test_data_url_must_be_base64(tmp_path):
    path = _write(tmp_path / "p.jsonl", [{"image": "data:image/png,rawpixels"}])
    with pytest.raises(DatasetError, match="base64"):
        trace_from_dataset(path)
