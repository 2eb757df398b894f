"""Generated datasets: counts, exact text tokens, images, determinism, sharding, delivery."""
from __future__ import annotations

import base64
import hashlib
import io
import pickle
from pathlib import Path

import numpy as np
import pytest
from conftest import read_rows
from PIL import Image

from mmdatagen.content.tokenizers import get_tokenizer
from mmdatagen.errors import SpecError
from mmdatagen.io.manifest import read_manifest
from mmdatagen.io.readers import iter_turns

SMALL = ["--image-size", "64x48", "--text-tokens", "40"]


def gen(run_cli, kind, out, *args):
    result = run_cli(kind, "-o", out, "-q", *args)
    assert result.exit_code == 0, result.output
    return Path(result.output.strip().splitlines()[-1])


def decode(ref: str, base: Path | None = None) -> Image.Image:
    if ref.startswith("data:"):
        data = base64.b64decode(ref.split(",", 1)[1])
    else:
        data = Path(ref).read_bytes()
    img = Image.open(io.BytesIO(data))
    img.load()
    return img


def test_pool_defaults_are_the_reference(run_cli, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    result = run_cli("pool", "-q")
    path = tmp_path / result.output.strip()
    rows = read_rows(path)
    assert len(rows) == 1000 and all(len(r["images"]) == 1 for r in rows)
    refs = [r["images"][0] for r in rows]
    assert len(set(refs[:200])) == 200 and set(refs[200:]) <= set(refs[:200])
    tok = get_tokenizer("qwen3-vl")
    assert all(len(tok.encode(r["text"])) == 400 for r in rows[:50])
    assert len({r["text"] for r in rows}) == 1000
    manifest = read_manifest(path)
    assert manifest.params["pool_size"] == 200 and len(manifest.images) == 200
    ref_of = {im.id: im.ref for im in manifest.images}
    assert [[ref_of[i] for i in ids] for ids in manifest.rows] == [r["images"] for r in rows]
    img = decode(refs[0])
    assert img.size == (640, 480) and img.format == "JPEG"


@pytest.mark.parametrize("tokenizer", ["words", "qwen2.5", "qwen3-vl", "qwen3.6"])
def test_text_has_exact_token_count(run_cli, tmp_path, tokenizer):
    path = gen(run_cli, "pool", tmp_path / "t.jsonl", "-n", 30, "--pool-size", 5,
               "--image-size", "32x32", "--image-content", "solid", "--text-tokens", 257,
               "--tokenizer", tokenizer, "--shared-prefix-tokens", 64)
    tok = get_tokenizer(tokenizer)
    rows = read_rows(path)
    prefix = tok.encode(rows[0]["text"])[:64]
    for row in rows:
        ids = tok.encode(row["text"])
        assert len(ids) == 257 and ids[:64] == prefix
    assert len({r["text"] for r in rows}) == 30


def test_word_list_is_fakers_read_from_its_source():
    """The filler text's words are Faker's English list, read from its source file (the fast
    path, not the import of every faker locale it falls back to)."""
    import importlib.util

    from faker.providers.lorem.en_US import Provider

    from mmdatagen.content.text import _class_literal, faker_word_list

    source = Path(importlib.util.find_spec("faker").origin).parent / "providers" / "lorem"
    assert _class_literal(source / "en_US" / "__init__.py", "Provider", "word_list") == \
        Provider.word_list
    assert faker_word_list() == tuple(Provider.word_list) and len(Provider.word_list) > 500
    assert _class_literal(source / "missing.py", "Provider", "word_list") is None


def test_local_hf_tokenizer_json(run_cli, tmp_path):
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    from mmdatagen.content.text import sentence_bank

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    tok.train_from_iterator(sentence_bank()[:500], trainers.BpeTrainer(
        vocab_size=600, initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), show_progress=False))
    tok.save(str(tmp_path / "tokenizer.json"))
    path = gen(run_cli, "pool", tmp_path / "t.jsonl", "-n", 5, "--pool-size", 5, *SMALL,
               "--tokenizer", tmp_path)
    hf = get_tokenizer(str(tmp_path))
    assert all(len(hf.encode(r["text"])) == 40 for r in read_rows(path))


@pytest.mark.parametrize("content,fmt", [("noise", "png"), ("noise", "jpeg"), ("photo", "jpeg"),
                                         ("photo", "png"), ("solid", "png"), ("folder", "jpeg")])
def test_images_decode_to_size_and_differ_in_pixels(run_cli, tmp_path, content, fmt):
    src = tmp_path / "src"
    src.mkdir()
    for i in range(3):
        Image.new("RGB", (50 + i, 40), (i * 40, 100, 200)).save(src / f"{i}.png")
    path = gen(run_cli, "pool", tmp_path / "d.jsonl", "-n", 40, "--pool-size", 12,
               "--image-size", "160x90", "--text-tokens", 10, "--image-content", content,
               "--image-format", fmt, "--image-source-dir", src)
    refs = sorted({r["images"][0] for r in read_rows(path)})
    assert len(refs) == 12
    pixels = set()
    for ref in refs:
        img = decode(ref)
        assert img.size == (160, 90) and img.format == fmt.upper()
        pixels.add(hashlib.sha256(img.convert("RGB").tobytes()).hexdigest())
    assert len(pixels) == 12


def test_same_seed_is_byte_identical_and_other_seed_differs(run_cli, tmp_path):
    args = ["-n", 30, "--pool-size", 10, *SMALL, "--image-content", "noise", "--image-format", "png",
            "--path-prefix", "/data/img"]
    outs = []
    for name, seed in (("a", 1), ("b", 1), ("c", 2)):
        path = gen(run_cli, "pool", tmp_path / name / "d.jsonl", "--seed", seed, *args)
        images = sorted((tmp_path / name / "d_images").iterdir())
        outs.append((path.read_bytes(), Path(str(path) + ".manifest.json").read_bytes(),
                     [p.read_bytes() for p in images]))
    assert outs[0] == outs[1]
    assert outs[0][0] != outs[2][0] and outs[0][2] != outs[2][2]


@pytest.mark.parametrize("kind,args", [
    ("pool", ["-n", 37, "--pool-size", 9, "--images-per-request", 2, "--delivery", "data-url"]),
    ("pool", ["-n", 37, "--pool-size", 9, "--path-prefix", "/mnt/x"]),
    ("sliding-window", ["--users", 3, "--turns", 4, "--window", 2, "--delivery", "data-url"]),
    ("sliding-window", ["--users", 5, "--turns", 3, "--window", 2, "--format", "multi_turn",
                        "--order", "random", "--image-uuids", "--delivery", "data-url"]),
])
@pytest.mark.parametrize("shards", [2, 3])
def test_sharded_equals_unsharded(run_cli, tmp_path, kind, args, shards):
    common = [*SMALL, "--image-content", "noise", "--image-format", "png", *args]
    full = gen(run_cli, kind, tmp_path / "full" / "d.jsonl", *common)
    parts = [gen(run_cli, kind, tmp_path / "sh" / "d.jsonl", "--shard-index", k,
                 "--num-shards", shards, *common) for k in range(shards)]
    assert b"".join(p.read_bytes() for p in parts) == full.read_bytes()
    assert len({p.name for p in parts}) == shards


def test_rows_load_as_aiperf_single_turn(run_cli, tmp_path):
    path = gen(run_cli, "pool", tmp_path / "d.jsonl", "-n", 10, "--pool-size", 4, *SMALL,
               "--image-uuids", "--output-length", 150)
    turns = list(iter_turns(path))
    assert len(turns) == 10
    for turn, row in zip(turns, read_rows(path)):
        assert set(row) == {"text", "images", "image_uuids", "output_length"}
        assert turn.output_length == 150 and len(turn.image_uuids) == 1
        assert Path(turn.images[0]).is_absolute() and Path(turn.images[0]).is_file()
    by_ref = {}
    for turn in turns:
        assert by_ref.setdefault(turn.images[0], turn.image_uuids[0]) == turn.image_uuids[0]


def test_url_delivery(run_cli, tmp_path):
    path = gen(run_cli, "pool", tmp_path / "d.jsonl", "-n", 5, "--pool-size", 5, *SMALL,
               "--delivery", "url", "--base-url", "http://img.local/pool/")
    refs = [r["images"][0] for r in read_rows(path)]
    assert all(r.startswith("http://img.local/pool/") for r in refs)
    assert (tmp_path / "d_images" / refs[0].rsplit("/", 1)[1]).is_file()


@pytest.mark.parametrize("fmt,target", [("jpeg", 20000), ("png", 30000), ("jpeg", 3000)])
def test_target_bytes_exact(run_cli, tmp_path, fmt, target):
    path = gen(run_cli, "pool", tmp_path / "d.jsonl", "-n", 4, "--pool-size", 4,
               "--image-size", "80x80", "--text-tokens", 5, "--image-format", fmt,
               "--image-content", "noise", "--target-bytes", target)
    for row in read_rows(path):
        assert Path(row["images"][0]).stat().st_size == target
        assert decode(row["images"][0]).size == (80, 80)


def test_sliding_window_rows_and_inline_images(run_cli, tmp_path):
    path = gen(run_cli, "sliding-window", tmp_path / "s.jsonl", "--users", 2, "--turns", 3,
               "--text-tokens", 20, "--image-content", "solid", "--text-sharing", "user")
    rows = read_rows(path)
    assert [r["session_id"] for r in rows] == ["user_0", "user_1"] * 3
    img = decode(rows[0]["images"][0])
    assert img.size == (2400, 1080)
    assert rows[0]["images"][1:] == rows[2]["images"][:4]
    assert rows[0]["text"] == rows[2]["text"] != rows[1]["text"]
    manifest = read_manifest(path)
    assert manifest.sessions[:2] == ["user_0", "user_1"] and len(manifest.images) == 14


def test_multi_turn_format(run_cli, tmp_path):
    path = gen(run_cli, "sliding-window", tmp_path / "m.jsonl", "--users", 3, "--turns", 2,
               "--window", 2, *SMALL, "--format", "multi_turn", "--image-content", "solid")
    rows = read_rows(path)
    assert [r["session_id"] for r in rows] == ["user_0", "user_1", "user_2"]
    assert all(len(r["turns"]) == 2 and "session_id" not in r["turns"][0] for r in rows)
    turns = list(iter_turns(path))
    assert [(t.session_id, t.turn_index) for t in turns][:2] == [("user_0", 0), ("user_0", 1)]


def test_inline_cache_budget_does_not_change_bytes(tmp_path):
    from mmdatagen.content.images import ImageFactory, ImageStyle
    from mmdatagen.content.text import TextEngine
    from mmdatagen.content.tokenizers import get_tokenizer
    from mmdatagen.generate import Delivery, OutputSpec, generate
    from mmdatagen.plans import sliding_window_plan

    plan = sliding_window_plan(users=3, turns=5, window=3, image_size="64x64")
    factory = ImageFactory(ImageStyle("noise", "png"), 0)
    texts = TextEngine(get_tokenizer("words"), 5, 0)
    outs = []
    for cache_mb in (0, 64):
        out = OutputSpec(path=tmp_path / f"c{cache_mb}.jsonl", quiet=True, cache_mb=cache_mb)
        outs.append(generate(plan, factory, texts, Delivery("data-url"), out, {}).path.read_bytes())
    assert outs[0] == outs[1]


def test_config_preset_and_override(run_cli, tmp_path):
    cfg = tmp_path / "c.yaml"
    cfg.write_text("num_requests: 12\npool-size: 3\nimage_size: [32x32]\ntext_tokens: 7\n"
                   "tokenizer: words\nimage_content: solid\n")
    path = gen(run_cli, "pool", tmp_path / "d.jsonl", "--config", cfg, "--num-requests", 5)
    rows = read_rows(path)
    assert len(rows) == 5 and len({r["images"][0] for r in rows}) == 3
    assert all(len(r["text"].split()) == 7 for r in rows)


def test_shipped_presets_load(run_cli, tmp_path):
    from mmdatagen.presets import find_config, load_yaml

    a = load_yaml(find_config("qwen3-vl-30b-pool200"))
    assert a["num_requests"] == 1000 and a["pool_size"] == 200 and a["text_tokens"] == 400
    b = load_yaml(find_config("qwen3.6-sliding-window"))
    assert (b["users"], b["turns"], b["window"], b["text_tokens"]) == (30, 8, 5, 8000)
    path = gen(run_cli, "pool", tmp_path / "d.jsonl", "--config", "qwen3-vl-30b-pool200",
               "-n", 3, "--image-size", "32x32", "--text-tokens", 5)
    assert len(read_rows(path)) == 3


def test_interrupted_run_leaves_no_output(tmp_path, monkeypatch):
    from mmdatagen.content.images import ImageFactory, ImageStyle
    from mmdatagen.content.text import TextEngine
    from mmdatagen.content.tokenizers import get_tokenizer
    from mmdatagen.generate import Delivery, OutputSpec, generate
    from mmdatagen.plans import pool_plan

    texts = TextEngine(get_tokenizer("words"), 5, 0)
    calls = {"n": 0}
    real = texts.text

    def flaky(key):
        calls["n"] += 1
        if calls["n"] == 50:
            raise KeyboardInterrupt
        return real(key)

    monkeypatch.setattr(texts, "text", flaky)
    out = OutputSpec(path=tmp_path / "d.jsonl", quiet=True)
    with pytest.raises(KeyboardInterrupt):
        generate(pool_plan(num_requests=100, pool_size=5, image_size="16x16"),
                 ImageFactory(ImageStyle("solid", "png"), 0), texts, Delivery("data-url"), out, {})
    assert list(tmp_path.iterdir()) == []


def test_noise_png_roundtrip_is_exact():
    from mmdatagen.content.images import noise_pixels
    from mmdatagen.content.png import encode_png_stored

    arr = noise_pixels(0, 3, 33, 17)
    img = Image.open(io.BytesIO(encode_png_stored(arr)))
    assert np.array_equal(np.asarray(img), arr)


def test_spec_errors_cross_the_worker_pool():
    # field errors are raised inside image workers (--target-bytes) and must arrive whole
    exc = pickle.loads(pickle.dumps(SpecError("target_bytes", "10 cannot be reached")))
    assert isinstance(exc, SpecError) and (exc.name, exc.problem) == ("target_bytes",
                                                                      "10 cannot be reached")
