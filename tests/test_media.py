"""Video and audio items: generation, reuse, determinism, sharding, AIPerf row shapes, errors."""
from __future__ import annotations

import base64
import io
import wave
from pathlib import Path

import av
import numpy as np
import orjson
import pytest
from conftest import read_rows, run_subprocess

from mmdatagen.content.audio import AudioFactory, AudioStyle
from mmdatagen.content.video import VideoFactory, VideoStyle
from mmdatagen.errors import DatasetError
from mmdatagen.io import hf
from mmdatagen.io.manifest import (
    AudioEntry,
    Manifest,
    VideoEntry,
    dump,
    manifest_path,
    read_manifest,
)
from mmdatagen.plans import pool_plan, sliding_window_plan

SMALL = ["--image-size", "32x24", "--text-tokens", "8", "--tokenizer", "words", "--video-size",
         "64x48", "--video-frames", "4", "--audio-duration", "0.25", "-q"]


def gen(run_cli, kind, out: Path, *args) -> Path:
    result = run_cli(kind, "-o", out, *SMALL, *args)
    assert result.exit_code == 0, result.output
    return Path(result.output.strip().splitlines()[-1])


def decode_video(data: bytes) -> tuple[list[np.ndarray], object]:
    with av.open(io.BytesIO(data)) as inp:
        stream = inp.streams.video[0]
        frames = [f.to_ndarray(format="gray") for f in inp.decode(stream)]
        return frames, (stream.codec_context.name, stream.average_rate, stream.width, stream.height)


def test_video_items_differ_and_move():
    factory = VideoFactory(VideoStyle(frames=6, fps=3), seed=0)
    clips = [decode_video(factory.encode(i, 96, 64)) for i in range(3)]
    for frames, (codec, rate, w, h) in clips:
        assert len(frames) == 6 and (w, h) == (96, 64) and codec == "h264" and float(rate) == 3
        assert all(np.abs(a.astype(int) - b).mean() > 0.5 for a, b in zip(frames, frames[1:]))
    firsts = [c[0][0].astype(int) for c in clips]
    assert min(np.abs(a - b).mean() for i, a in enumerate(firsts) for b in firsts[i + 1:]) > 2
    assert factory.encode(1, 96, 64) == VideoFactory(VideoStyle(frames=6, fps=3), 0).encode(1, 96, 64)


@pytest.mark.parametrize("container,codec", [("mp4", "h264"), ("webm", "vp9"), ("mp4", "hevc"),
                                             ("webm", "vp8")])
def test_codecs_decode_and_are_byte_deterministic(container, codec):
    style = VideoStyle(container=container, codec=codec, frames=3, fps=1.5)
    data = VideoFactory(style, 7).encode(2, 64, 48)
    assert data == VideoFactory(style, 7).encode(2, 64, 48)
    frames, (name, _, w, h) = decode_video(data)
    assert len(frames) == 3 and (w, h) == (64, 48) and name.startswith(codec[:3])


@pytest.mark.parametrize("fmt,rate,channels", [("wav", 16000, 1), ("wav", 44100, 2),
                                               ("mp3", 22050, 1), ("mp3", 48000, 2)])
def test_audio_formats(fmt, rate, channels):
    style = AudioStyle(fmt=fmt, sample_rate=rate, channels=channels, duration=0.5)
    a, b = AudioFactory(style, 1).encode(0), AudioFactory(style, 1).encode(1)
    assert a == AudioFactory(style, 1).encode(0) and a != b
    with av.open(io.BytesIO(a)) as inp:
        s = inp.streams.audio[0]
        assert (s.sample_rate, s.channels) == (rate, channels)
        samples = sum(f.samples for f in inp.decode(s))
    assert abs(samples - rate // 2) <= (2400 if fmt == "mp3" else 0)
    if fmt == "wav":
        with wave.open(io.BytesIO(a)) as w:
            assert (w.getframerate(), w.getnchannels(), w.getsampwidth(), w.getnframes()) == \
                (rate, channels, 2, rate // 2)


def test_pool_reuse_rules_apply_per_modality():
    plan = pool_plan(num_requests=40, pool_size=10, images_per_request=1, videos_per_request=2,
                     audios_per_request=1, video_pool_size=6, seed=3)
    vids = plan.media["video"].ids
    assert vids.shape == (40, 2) and plan.media["video"].num_items == 6
    assert sorted(set(vids[:3].reshape(-1).tolist())) == list(range(6))  # first pass: unique
    assert all(len(set(r)) == 2 for r in vids.tolist())
    assert plan.media["audio"].ids.shape == (40, 1) and plan.media["audio"].num_items == 10
    alone = pool_plan(num_requests=40, pool_size=10, images_per_request=1, seed=3)
    assert (alone.image_ids == plan.image_ids).all()  # adding media never moves the images
    cyc = pool_plan(num_requests=5, pool_size=4, images_per_request=0, videos_per_request=1,
                    reuse="cyclic")
    assert cyc.media["video"].ids[:, 0].tolist() == [0, 1, 2, 3, 0] and cyc.image_ids.shape == (5, 0)


def test_sliding_window_slides_videos_per_user():
    plan = sliding_window_plan(users=2, turns=3, window=0, stride=1, videos_per_request=2,
                               audios_per_request=1, order="user-major")
    v = plan.media["video"].ids.tolist()
    assert v == [[0, 1], [1, 2], [2, 3], [4, 5], [5, 6], [6, 7]]
    assert plan.media["audio"].ids[:, 0].tolist() == [0, 1, 2, 3, 4, 5]
    assert plan.image_ids.shape == (6, 0)


def test_mixed_pool_rows_manifest_and_files(run_cli, tmp_path):
    path = gen(run_cli, "pool", tmp_path / "m.jsonl", "-n", 12, "--pool-size", 4,
               "--videos-per-request", 1, "--audios-per-request", 1, "--video-pool-size", 3,
               "--image-uuids")
    rows = read_rows(path)
    media = read_manifest(path).media
    assert [len(r["images"]) for r in rows] == [1] * 12
    assert all(r["videos"][0].endswith(".mp4") and r["audios"][0].endswith(".wav") for r in rows)
    assert media["video"].rows == [[int(Path(r["videos"][0]).stem.split("_")[1])] for r in rows]
    items = {e.id: e for e in media["video"].items}
    assert set(items) == {0, 1, 2}
    for e in items.values():
        assert isinstance(e, VideoEntry) and e.ref is not None and e.uuid is not None
        data = Path(e.ref).read_bytes()
        assert e.bytes == len(data) and (e.width, e.height, e.frames) == (64, 48, 4)
        assert e.fps == 2.0 and e.duration == 2.0 and len(e.uuid) == 36
        assert len(decode_video(data)[0]) == 4
    audio = media["audio"].items[0]
    assert isinstance(audio, AudioEntry)
    assert (audio.sample_rate, audio.channels, audio.samples) == (16000, 1, 4000)


def test_typed_manifest_round_trips_byte_for_byte(run_cli, tmp_path):
    # merge rewrites manifests through the typed Manifest: reading and dumping must not move a byte
    path = gen(run_cli, "pool", tmp_path / "r.jsonl", "-n", 6, "--pool-size", 3,
               "--videos-per-request", 1, "--audios-per-request", 1, "--image-uuids")
    raw = manifest_path(path).read_bytes()
    assert dump(Manifest.from_dict(orjson.loads(raw))) == raw
    data = orjson.loads(raw)
    data["media"]["audio"]["style"]["duration"] = 1  # another writer's integer stays an integer
    again = orjson.loads(dump(Manifest.from_dict(data)))
    assert again["media"]["audio"]["style"]["duration"] == 1
    assert isinstance(again["media"]["audio"]["style"]["duration"], int)
    del data["media"]["video"]["items"][0]["frames"]
    with pytest.raises(DatasetError, match="malformed manifest"):
        Manifest.from_dict(data, "m.json")


def test_inline_delivery_is_aiperf_form_and_deterministic(run_cli, tmp_path):
    args = ["--users", 2, "--turns", 3, "--window", 1, "--videos-per-request", 2,
            "--audios-per-request", 1, "--video-format", "webm", "--audio-format", "mp3",
            "--audio-sample-rate", "22050"]
    a = gen(run_cli, "sliding-window", tmp_path / "a.jsonl", *args)
    b = gen(run_cli, "sliding-window", tmp_path / "b.jsonl", *args)
    assert a.read_bytes() == b.read_bytes()
    for row in read_rows(a):
        assert all(v.startswith("data:video/webm;base64,") for v in row["videos"])
        assert len(row["audios"]) == 1 and row["audios"][0].startswith("mp3,")
        base64.b64decode(row["audios"][0][4:], validate=True)
    # the same video id is the same bytes wherever it appears
    m = read_manifest(a).media["video"]
    seen = {}
    for ids, row in zip(m.rows, read_rows(a)):
        for i, ref in zip(ids, row["videos"]):
            assert seen.setdefault(i, ref) == ref


def test_url_delivery_keeps_audio_inline(run_cli, tmp_path):
    path = gen(run_cli, "pool", tmp_path / "u.jsonl", "-n", 3, "--pool-size", 2,
               "--videos-per-request", 1, "--audios-per-request", 1, "--delivery", "url",
               "--base-url", "http://h/m")
    for row in read_rows(path):
        assert row["videos"][0].startswith("http://h/m/video_") and row["audios"][0].startswith("wav,")


@pytest.mark.parametrize("kind,args", [
    ("pool", ["-n", 7, "--pool-size", 3, "--videos-per-request", 1, "--audios-per-request", 1]),
    ("sliding-window", ["--users", 3, "--turns", 2, "--window", 1, "--videos-per-request", 1,
                        "--audios-per-request", 1, "--delivery", "path"]),
])
def test_shards_merge_to_the_single_process_bytes(run_cli, tmp_path, kind, args):
    whole = gen(run_cli, kind, tmp_path / "w.jsonl", *args)
    for k in range(3):
        gen(run_cli, kind, tmp_path / "s.jsonl", *args, "--num-shards", 3, "--shard-index", k,
            "--image-dir", tmp_path / "w_images")
    assert run_cli("merge", "-o", tmp_path / "s.jsonl").exit_code == 0
    assert (tmp_path / "s.jsonl").read_bytes() == whole.read_bytes()
    want, got = read_manifest(whole), read_manifest(tmp_path / "s.jsonl")
    assert got.media == want.media


def test_hf_export_carries_videos_and_audios(run_cli, tmp_path):
    path = gen(run_cli, "pool", tmp_path / "h.jsonl", "-n", 4, "--pool-size", 2,
               "--videos-per-request", 1, "--audios-per-request", 1, "--delivery", "data-url",
               "--output-format", "hf", "--hf-parquet")
    rows = read_rows(path)
    for where in (hf.hf_dir(path), hf.parquet_path(path)):
        ds = hf.load(where)
        assert ds[0]["audios"][0][:4] == b"RIFF"
        assert hf.jsonl_rows(ds, "jpeg") == rows
    assert orjson.loads((hf.hf_dir(path) / hf.MANIFEST_NAME).read_bytes())["media"]


BAD = [
    ["pool", "--videos-per-request", "1", "--video-frames", "0"],
    ["pool", "--videos-per-request", "1", "--video-fps", "0"],
    ["pool", "--videos-per-request", "1", "--video-fps", "-2"],
    ["pool", "--videos-per-request", "1", "--video-codec", "mpeg2"],
    ["pool", "--videos-per-request", "1", "--video-format", "avi"],
    ["pool", "--videos-per-request", "1", "--video-format", "webm", "--video-codec", "h264"],
    ["pool", "--videos-per-request", "1", "--video-size", "65x48"],
    ["pool", "--audios-per-request", "1", "--audio-sample-rate", "1000"],
    ["pool", "--audios-per-request", "1", "--audio-sample-rate", "500000"],
    ["pool", "--audios-per-request", "1", "--audio-format", "mp3", "--audio-sample-rate", "96000"],
    ["pool", "--audios-per-request", "1", "--audio-channels", "3"],
    ["pool", "--images-per-request", "0"],
    ["pool", "--videos-per-request", "-1"],
    ["sliding-window", "--window", "0"],
]


@pytest.mark.parametrize("args", BAD, ids=[" ".join(a) for a in BAD])
def test_bad_media_input_is_one_line_exit_2(run_cli, tmp_path, args):
    out = tmp_path / "d.jsonl"
    result = run_cli(*args, "-n" if args[0] == "pool" else "--users", "2", "--image-size", "16x16",
                     "--text-tokens", "3", "--tokenizer", "words", "-o", out)
    assert result.exit_code == 2, result.output
    lines = result.output.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: "), result.output
    assert not list(tmp_path.rglob("*.jsonl")) and not list(tmp_path.rglob("*.mp4"))


def test_bad_media_input_from_the_shell(tmp_path):
    proc = run_subprocess("pool", "--videos-per-request", "1", "--video-fps", "0", "-o", "d.jsonl",
                          cwd=tmp_path)
    assert proc.returncode == 2 and proc.stderr.startswith("error: --video-fps")
    assert len(proc.stderr.strip().splitlines()) == 1 and not list(tmp_path.iterdir())


def test_loader_sends_audio_and_video_parts_as_aiperf(run_cli, tmp_path):
    from mmdatagen.io.readers import iter_turns
    from mmdatagen.loadgen.payload import ImageEncoder, user_content

    path = gen(run_cli, "pool", tmp_path / "l.jsonl", "-n", 6, "--pool-size", 2,
               "--videos-per-request", 1, "--audios-per-request", 1, "--video-format", "webm")
    encoder = ImageEncoder()
    bodies = [user_content(t, encoder) for t in iter_turns(path)]
    assert encoder.encoded == 6  # 2 images, 2 videos, 2 audios: each local file once
    for row, parts in zip(read_rows(path), bodies):
        assert [p["type"] for p in parts] == ["text", "image_url", "input_audio", "video_url"]
        video = Path(row["videos"][0]).read_bytes()
        assert parts[3]["video_url"]["url"] == \
            "data:video/webm;base64," + base64.b64encode(video).decode()
        audio = Path(row["audios"][0]).read_bytes()
        assert parts[2]["input_audio"] == {"data": base64.b64encode(audio).decode(), "format": "wav"}
    inline = gen(run_cli, "pool", tmp_path / "i.jsonl", "-n", 2, "--pool-size", 2,
                 "--videos-per-request", 1, "--audios-per-request", 1, "--delivery", "data-url")
    for row, turn in zip(read_rows(inline), iter_turns(inline)):
        parts = user_content(turn, ImageEncoder())
        assert parts[3]["video_url"]["url"] == row["videos"][0]
        assert parts[2]["input_audio"]["data"] == row["audios"][0][4:]


def test_simulator_prices_video_and_audio_parts():
    from sim_helpers import MODEL, chat, fast_profile

    from mmdatagen.media_tokens import QWEN2_AUDIO, audio_tokens, video_cost, video_geometry
    from mmdatagen.sim.protocol import ImageResolver, RequestError, parse_body
    from mmdatagen.vlm import get_model

    profile = fast_profile()
    model = get_model(profile.model)
    resolver = ImageResolver(model, profile)
    clip = VideoFactory(VideoStyle(frames=12, fps=4), 0).encode(0, 320, 240)
    wav = AudioFactory(AudioStyle(duration=2.0), 0).encode(0)
    parts = [{"type": "text", "text": "abcd"},
             {"type": "input_audio", "input_audio": {"data": base64.b64encode(wav).decode(),
                                                     "format": "wav"}},
             {"type": "video_url",
              "video_url": {"url": "data:video/mp4;base64," + base64.b64encode(clip).decode()}}]
    req = parse_body(orjson.dumps(chat(parts)), "chat", profile, resolver, frozenset({MODEL}))
    audio, video = req.images
    geom = video_geometry(model.family, model.patch_size, model.merge_size)
    cost = video_cost(geom, 12, 4.0, 320, 240)
    assert video.tokens == cost.tokens and video.prompt_tokens == cost.prompt_tokens
    assert audio.tokens == audio_tokens(QWEN2_AUDIO, 32000, 16000) == 50
    assert req.prompt_tokens == 1 + cost.prompt_tokens + 52
    again = parse_body(orjson.dumps(chat(parts)), "chat", profile, resolver, frozenset({MODEL}))
    assert [i.key for i in again.images] == [i.key for i in req.images]  # same content, same key
    for bad in ({"type": "video_url", "video_url": {"url": "data:video/mp4;base64,AAAA"}},
                {"type": "video_url", "video_url": {"url": "/local/file.mp4"}},
                {"type": "input_audio", "input_audio": {"data": "!!", "format": "wav"}},
                {"type": "input_audio", "input_audio": {"data": "AAAA", "format": "ogg"}}):
        with pytest.raises(RequestError) as info:
            parse_body(orjson.dumps(chat([bad])), "chat", profile, resolver, frozenset({MODEL}))
        assert info.value.status == 400


def test_bench_and_simulate_run_a_mixed_dataset(run_cli, tmp_path):
    path = gen(run_cli, "pool", tmp_path / "b.jsonl", "-n", 8, "--pool-size", 2,
               "--videos-per-request", 1, "--audios-per-request", 1)
    # bench's simulator at 10x speed: one request at a time, the counts are the same at any speed
    for cmd in (["bench", "--input-file", path, "--request-count", 8, "--concurrency", 1,
                 "--time-scale", 0.1],
                ["simulate", path, "--concurrency", 2]):
        out = tmp_path / cmd[0]
        result = run_cli(*cmd, "-q", "--output-dir", out)
        assert result.exit_code == 0, result.output
        export = orjson.loads((out / "profile_export_mmdatagen.json").read_bytes())
        assert export["error_summary"] == [] and export["request_count"]["avg"] == 8
        measured = export["image_cache"]["measured"]
        # Dynamo's two tiers (the default target): what vLLM's encoder cache in front served
        # never reached Dynamo's counters
        counters = (export["image_cache"]["server_metrics"] if cmd[0] == "bench"
                    else export["run_info"]["embedding_cache"])
        assert measured["hits"] + measured["misses"] + counters["encoder_hits"] == 8 * 3
        assert measured["misses"] == 6  # 2 images, 2 videos, 2 audios, each missed once


def test_worker_count_never_changes_a_byte(run_cli, tmp_path):
    args = ["-n", 6, "--pool-size", 3, "--videos-per-request", 1, "--audios-per-request", 1,
            "--video-format", "webm", "--audio-format", "mp3", "--delivery", "data-url"]
    one = gen(run_cli, "pool", tmp_path / "one.jsonl", *args, "--workers", 1)
    two = gen(run_cli, "pool", tmp_path / "two.jsonl", *args, "--workers", 2)
    assert one.read_bytes() == two.read_bytes()


@pytest.mark.parametrize("cache,size", [("vllm-encoder", "150"), ("vllm-processor", "0.003")])
def test_simulator_hits_equal_the_media_replay(run_cli, tmp_path, cache, size):
    from mmdatagen.analysis.reuse import media_reuse
    from mmdatagen.caches import get_target
    from mmdatagen.vlm import get_model

    path = gen(run_cli, "pool", tmp_path / "r.jsonl", "-n", 16, "--pool-size", 4,
               "--videos-per-request", 1, "--audios-per-request", 1, "--reuse", "uniform")
    out = tmp_path / "sim"
    result = run_cli("simulate", path, "--concurrency", 1, "--cache", cache, "--cache-size", size,
                     "-q", "--output-dir", out)
    assert result.exit_code == 0, result.output
    measured = orjson.loads((out / "profile_export_mmdatagen.json").read_bytes())["image_cache"]
    target = get_target(cache)
    replay = media_reuse(read_manifest(path), get_model("qwen3-vl-30b-a3b"), target,
                         target.capacity(float(size)))
    assert 0 < replay.total.hits < 36  # the cache is too small for the 12 items: evictions
    assert measured["measured"]["hits"] == replay.total.hits
    assert measured["measured"]["misses"] == replay.total.references - replay.total.hits
