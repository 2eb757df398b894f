"""Hugging Face datasets: --output-format hf / --hf-parquet, and --image-content hf."""
from __future__ import annotations

import hashlib
import io
from pathlib import Path

import orjson
import pytest
from conftest import read_rows
from datasets import Image as HFImage
from datasets import List
from PIL import Image

from mmdatagen.io import hf
from mmdatagen.io.manifest import read_manifest

SMALL = ["--image-size", "48x32", "--text-tokens", "16", "--image-content", "noise",
         "--image-format", "png", "-q"]


def gen(run_cli, kind, out: Path, *args) -> Path:
    result = run_cli(kind, "-o", out, *SMALL, *args)
    assert result.exit_code == 0, result.output
    return Path(result.output.strip().splitlines()[-1])


@pytest.mark.parametrize("kind,args", [
    ("pool", ["-n", 9, "--pool-size", 4, "--images-per-request", 2, "--image-uuids",
              "--output-length", 7]),
    ("pool", ["-n", 6, "--pool-size", 3, "--delivery", "url", "--base-url", "http://h/img"]),
    ("sliding-window", ["--users", 2, "--turns", 3, "--window", 2]),
    ("sliding-window", ["--users", 3, "--turns", 2, "--window", 2, "--format", "multi_turn",
                        "--order", "random", "--delivery", "path", "--image-format", "jpeg"]),
])
def test_hf_rows_equal_the_jsonl(run_cli, tmp_path, kind, args):
    path = gen(run_cli, kind, tmp_path / "d.jsonl", "--output-format", "hf", "--hf-parquet", *args)
    manifest = read_manifest(path)
    rows = read_rows(path)
    for where in (hf.hf_dir(path), hf.parquet_path(path)):
        ds = hf.load(where)
        assert len(ds) == len(manifest.rows)
        assert [ex for ex in ds["image_ids"]] == manifest.rows
        rebuilt = hf.jsonl_rows(ds, manifest.image_format)
        assert rebuilt == rows
        assert b"".join(orjson.dumps(r) + b"\n" for r in rebuilt) == path.read_bytes()
    ds = hf.load(hf.hf_dir(path))
    img = ds[0]["images"][0]
    assert isinstance(img, Image.Image) and img.size == (48, 32)
    by_id = {e.id: e for e in manifest.images}
    raw = ds.cast_column("images", List(HFImage(decode=False)))[0]["images"][0]["bytes"]
    assert len(raw) == by_id[manifest.rows[0][0]].bytes
    assert orjson.loads((hf.hf_dir(path) / hf.MANIFEST_NAME).read_bytes()) == manifest.to_dict()
    assert orjson.loads(ds.info.description)["params"] == manifest.params


def test_hf_output_refuses_existing_without_force(run_cli, tmp_path):
    args = ["-n", 3, "--pool-size", 2, "--output-format", "hf"]
    path = gen(run_cli, "pool", tmp_path / "d.jsonl", *args)
    path.unlink()
    Path(f"{path}.manifest.json").unlink()
    result = run_cli("pool", "-o", path, *SMALL, *args)
    assert result.exit_code == 2 and "_hf exists" in result.output
    assert run_cli("pool", "-o", path, *SMALL, *args, "--force").exit_code == 0


@pytest.fixture
def photos(tmp_path) -> Path:
    """A small local HF dataset with an image column (5 distinct pictures) and a label."""
    from datasets import Dataset, Features, Value

    pics = []
    for i in range(5):
        buf = io.BytesIO()
        Image.new("RGB", (90 + 10 * i, 60), (40 * i, 255 - 30 * i, 90)).save(buf, "PNG")
        pics.append({"bytes": buf.getvalue(), "path": None})
    ds = Dataset.from_dict({"picture": pics, "label": list(range(5))},
                           features=Features({"picture": HFImage(), "label": Value("int64")}))
    ds.save_to_disk(str(tmp_path / "photos"))
    return tmp_path / "photos"


def test_image_content_hf_draws_resized_distinct_slots(run_cli, tmp_path, photos):
    path = gen(run_cli, "pool", tmp_path / "d.jsonl", "-n", 30, "--pool-size", 12,
               "--image-content", "hf", "--hf-dataset", photos, "--hf-image-column", "picture",
               "--image-size", "160x90", "--image-format", "jpeg")
    refs = sorted({r["images"][0] for r in read_rows(path)})
    assert len(refs) == 12
    digests = set()
    for ref in refs:
        img = Image.open(ref)
        assert img.size == (160, 90) and img.format == "JPEG"
        digests.add(hashlib.sha256(img.convert("RGB").tobytes()).hexdigest())
    assert len(digests) == 12
    # the first pool slot comes from the dataset's first picture (green-dominant), not synthetic
    first = Image.open(sorted(refs)[0]).convert("RGB").resize((1, 1)).getpixel((0, 0))
    assert abs(first[1] - 255) < 30 and abs(first[0] - 0) < 30
    assert read_manifest(path).params["hf_dataset"] == str(photos)


@pytest.mark.parametrize("args,message", [
    ([], "needs --hf-dataset"),
    (["--hf-dataset", "nowhere"], "does not exist"),
    (["--hf-dataset", "PHOTOS"], "has no column 'image'"),
    (["--hf-dataset", "PHOTOS", "--hf-image-column", "label"], "is not an Image feature"),
])
def test_image_content_hf_errors(run_cli, tmp_path, photos, args, message):
    args = [str(photos) if a == "PHOTOS" else a for a in args]
    result = run_cli("pool", "-o", tmp_path / "d.jsonl", "-n", 2, "--pool-size", 2, *SMALL[:4],
                     "--image-content", "hf", *args)
    assert result.exit_code == 2 and message in result.output, result.output
    assert result.output.count("\n") == 1 and not (tmp_path / "d.jsonl").exists()


@pytest.mark.parametrize("parquet", [False, True])
def test_hf_output_stopped_after_it_was_placed_leaves_nothing(run_cli, tmp_path, monkeypatch,
                                                                parquet):
    """A SIGTERM while the work folder is removed, after the copies are in place: the command
    removes its JSONL, so the copies go too (no half of the output stays)."""
    import signal
    import tempfile

    from mmdatagen.lifecycle import Terminated

    class StoppedOnCleanup(tempfile.TemporaryDirectory):
        def __exit__(self, *exc):
            super().__exit__(*exc)
            raise Terminated(signal.SIGTERM)

    monkeypatch.setattr(hf.tempfile, "TemporaryDirectory", StoppedOnCleanup)
    result = run_cli("pool", "-o", tmp_path / "d.jsonl", *SMALL, "-n", 3, "--pool-size", 2,
                     "--output-format", "hf", *(["--hf-parquet"] if parquet else []))
    assert result.exit_code == 143, result.output
    assert sorted(p.name for p in tmp_path.iterdir()) == []
