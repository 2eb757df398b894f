"""``analyze`` on datasets with videos and audio: per-modality numbers in one shared cache.

The per-modality numbers are checked against an independent LRU written here (an OrderedDict
keyed by each part's reference string, entries sized from the model's published rules), and
the headline against the exact replay of the shared cache model (``targets.Replay``).
"""
from __future__ import annotations

import json
from collections import OrderedDict
from pathlib import Path

import numpy as np
import pytest
from conftest import read_rows

from mmdatagen.analysis.predict import Semantics, analyze
from mmdatagen.analysis.targets import Replay
from mmdatagen.analysis.trace import trace_from_manifest
from mmdatagen.caches import get_target
from mmdatagen.io.manifest import AudioEntry, VideoEntry, read_manifest
from mmdatagen.media_tokens import QWEN2_AUDIO, audio_tokens, video_cost, video_geometry
from mmdatagen.vlm import get_model

SMALL = ["--image-size", "32x24", "--text-tokens", "4", "--tokenizer", "words", "--video-size",
         "64x48", "--video-frames", "4", "--audio-duration", "0.25", "-q"]
MODEL = get_model("qwen3-vl-30b-a3b")
MiB = 1 << 20


def _gen(run_cli, tmp_path: Path, name: str, *args) -> Path:
    out = tmp_path / name
    result = run_cli(*args, "-o", out, *SMALL)
    assert result.exit_code == 0, result.output
    return out


def _oracle_sizes(manifest) -> dict[str, tuple[str, int, int]]:
    """Reference string -> (modality, embedding bytes, tokens), from the manifest's values."""
    geom = video_geometry(MODEL.family, MODEL.patch_size, MODEL.merge_size)
    out = {}
    for im in manifest.images:
        out[im.ref] = ("image", MODEL.entry_bytes(im.width, im.height),
                       MODEL.image_tokens(im.width, im.height))
    for v in manifest.media["video"].items if "video" in manifest.media else []:
        assert isinstance(v, VideoEntry)
        tok = video_cost(geom, v.frames, v.fps, v.width, v.height).tokens
        out[v.ref] = ("video", tok * MODEL.bytes_per_token, tok)
    for a in manifest.media["audio"].items if "audio" in manifest.media else []:
        assert isinstance(a, AudioEntry)
        tok = audio_tokens(QWEN2_AUDIO, a.samples, a.sample_rate)
        out[a.ref] = ("audio", tok * MODEL.bytes_per_token, tok)
    return out


def _oracle(path: Path, capacity: int, sizes: dict) -> dict[str, list[int]]:
    """Per modality [references, hits, hit bytes, hit tokens]: a byte LRU filled at lookup that
    skips entries larger than the cache (Dynamo's embedding cache with nothing in front of it:
    dynamo-encode registering at schedule), rows in file order, each row's parts in AIPerf's
    order, multi_turn rows resending their history."""
    cache: OrderedDict[str, int] = OrderedDict()
    used = 0
    out = {m: [0, 0, 0, 0] for m in ("image", "audio", "video")}
    history: dict = {}
    for row in read_rows(path):
        for turn in row.get("turns", [row]):
            parts = turn.get("images", []) + turn.get("audios", []) + turn.get("videos", [])
            sid = row.get("session_id")
            refs = history.setdefault(sid, []) + parts if "turns" in row else parts
            if "turns" in row:
                history[sid] = refs
            for ref in refs:
                modality, size, tokens = sizes[ref]
                counts = out[modality]
                counts[0] += 1
                if ref in cache:
                    cache.move_to_end(ref)
                    counts[1:] = [counts[1] + 1, counts[2] + size, counts[3] + tokens]
                elif size <= capacity:
                    cache[ref] = size
                    used += size
                    while used > capacity:
                        used -= cache.popitem(last=False)[1]
    return {m: v for m, v in out.items() if v[0]}


CASES = {
    "pool-zipf": ["pool", "-n", "40", "--pool-size", "6", "--reuse", "zipf",
                  "--images-per-request", "2", "--videos-per-request", "1",
                  "--audios-per-request", "1", "--video-pool-size", "4"],
    "pool-video-only": ["pool", "-n", "30", "--pool-size", "5", "--reuse", "uniform",
                        "--images-per-request", "0", "--videos-per-request", "2"],
    "sliding-window": ["sliding-window", "--users", "3", "--turns", "4", "--window", "2",
                       "--videos-per-request", "2", "--audios-per-request", "1", "--order",
                       "user-major", "--delivery", "path"],
    "sliding-window-multi-turn": ["sliding-window", "--users", "2", "--turns", "3", "--window",
                                  "1", "--videos-per-request", "1", "--format", "multi_turn",
                                  "--delivery", "path"],
}


@pytest.mark.parametrize("case", sorted(CASES))
def test_per_modality_numbers_match_an_independent_lru(run_cli, tmp_path, case):
    path = _gen(run_cli, tmp_path, "d.jsonl", *CASES[case])
    manifest = read_manifest(path)
    sizes = _oracle_sizes(manifest)
    distinct = sum(size for _, size, _ in sizes.values())
    caps = [distinct * f / 2**30 for f in (0.08, 0.25, 0.5, 2.0)]
    doc = json.loads(run_cli("analyze", path, "--cache", "dynamo-encode", "--insert", "schedule",
                             "--json", "--cache-size",
                             ",".join(f"{c:.12g}" for c in caps)).output)
    modalities = set(doc["modalities"])
    assert "video" in modalities
    for row in doc["capacities"]:
        want = _oracle(path, row["capacity_bytes"], sizes)
        assert set(want) == modalities
        for m, (refs, hits, hit_bytes, hit_tokens) in want.items():
            got = row["by_modality"][m]
            assert (got["references"], got["hits"], got["bytes_hit"], got["tokens_saved"]) == \
                (refs, hits, hit_bytes, hit_tokens), (case, row["capacity"], m)
        assert row["hits"] == sum(v[1] for v in want.values())
    assert any(0 < r["hits"] < doc["best"]["hits"] for r in doc["capacities"]), \
        "the capacities must evict something for the comparison to mean anything"


@pytest.mark.parametrize("target", ["dynamo-embedding", "dynamo-connector", "dynamo-encode",
                                    "vllm-processor", "vllm-processor-shm", "vllm-encoder",
                                    "sglang-vlm"])
def test_headline_counts_every_modality_like_the_exact_replay(run_cli, tmp_path, target):
    path = _gen(run_cli, tmp_path, "d.jsonl", *CASES["pool-zipf"])
    t = get_target(target)
    trace = trace_from_manifest(read_manifest(path))
    sizes, _ = trace.costs(MODEL, target=t)
    span = int(sizes[np.unique(trace.ids)].sum())
    caps = sorted({int(span * f) for f in (0.05, 0.2, 0.45, 0.8)} | {span + 1})
    budget = 160 if t.front else None  # two tiers: vLLM's encoder cache holds one request
    a = analyze(trace, MODEL, Semantics(target=target, encoder_budget=budget), caps,
                want_curve=False)
    replay = Replay(t, trace, sizes, front_tokens=budget, bytes_per_token=MODEL.bytes_per_token)
    for cap, row in zip(caps, a.summary["capacities"]):
        flags = replay.flags(cap)
        assert row["hits"] == int(flags.sum()), (target, cap)
        per = {m: r["hits"] for m, r in row["by_modality"].items()}
        mods = trace.modality[trace.ids]
        assert per == {m: int(flags[mods == k].sum()) for k, m in
                       enumerate(("image", "audio", "video")) if (mods == k).any()}
    served = a.summary.get("front", {}).get("hits", 0)
    assert a.summary["references"] + served == trace.ids.size == 40 * 4
    assert (served > 0) == (t.front is not None)
    hits = [r["hits"] for r in a.summary["capacities"]]
    assert hits[-1] == a.summary["best"]["hits"] > 0
    assert any(0 < h < hits[-1] for h in hits) or target == "sglang-vlm"  # sets rarely repeat


def test_scanned_dataset_equals_its_manifest(run_cli, tmp_path):
    """Without the manifest, videos and audio are identified by their bytes: the same trace."""
    path = _gen(run_cli, tmp_path, "d.jsonl", *CASES["sliding-window"][:-4], "--delivery",
                "data-url")
    args = ("analyze", path, "--cache", "vllm-processor", "--cache-size", "0.002,4", "--json")
    with_manifest = json.loads(run_cli(*args).output)
    scanned = json.loads(run_cli(*args, "--no-manifest").output)
    for key in ("references", "distinct_images", "best", "capacities", "modalities",
                "thresholds"):
        assert scanned[key] == with_manifest[key], key
    rows = read_rows(path)
    assert rows[0]["audios"][0].startswith("wav,") and rows[0]["videos"][0].startswith("data:")


def test_console_and_curve_show_each_modality(run_cli, tmp_path):
    path = _gen(run_cli, tmp_path, "d.jsonl", *CASES["pool-zipf"])
    out = run_cli("analyze", path, "--cache", "vllm-encoder", "--cache-size", "200,5000",
                  "--curve", tmp_path / "c.json")
    assert out.exit_code == 0, out.output
    text = out.output
    assert "item references        160 (image 80, audio 40, video 40)" in text, text
    assert "per modality (one cache holds every modality" in text
    for m in ("image", "audio", "video"):
        assert f"best    {m}" in text or f"{m}     " in text
    curve = json.loads((tmp_path / "c.json").read_bytes())
    assert curve["summary"]["modalities"]["video"]["references"] == 40


def test_generic_model_cannot_size_videos(run_cli, tmp_path):
    path = _gen(run_cli, tmp_path, "d.jsonl", *CASES["pool-video-only"])
    out = run_cli("analyze", path, "--tokens-per-image", "100", "--bytes-per-token", "10")
    assert out.exit_code == 2 and "no video rule" in out.output


def test_sessions_in_flight_and_completion_per_modality_equal_the_event_replay(run_cli, tmp_path):
    """Causal session dispatch with 3 sessions in flight, entries present only after encoding:
    every modality's hits equal the cache model replayed over the same events."""
    from mmdatagen.analysis.predict import _dispatched

    path = _gen(run_cli, tmp_path, "d.jsonl", *CASES["sliding-window"][:-4], "--order", "random",
                "--delivery", "path")
    trace = trace_from_manifest(read_manifest(path))
    sem = Semantics(target="dynamo-encode", in_flight=3, dispatch="sessions", orders=1)
    t = sem.cache()
    sizes, _ = trace.costs(MODEL, target=t)
    span = int(sizes[np.unique(trace.ids)].sum())
    caps = sorted({int(span * f) for f in (0.002, 0.005, 0.01, 0.02, 0.05, 0.1, 0.3, 1.01)})
    a = analyze(trace, MODEL, sem, caps, want_curve=False)
    ordered, ev = _dispatched(trace, sem, None)
    replay = Replay(t, ordered, sizes, ev)
    mods = ordered.modality[ordered.ids]
    seen = set()
    for cap, row in zip(caps, a.summary["capacities"]):
        flags = replay.flags(cap)
        per = {m: r["hits"] for m, r in row["by_modality"].items()}
        assert per == {m: int(flags[mods == k].sum()) for k, m in
                       enumerate(("image", "audio", "video")) if (mods == k).any()}, cap
        seen.add(int(flags.sum()))
    assert len(seen) > 2  # the capacities matter


def test_curve_file_has_each_modality_at_every_breakpoint(run_cli, tmp_path):
    path = _gen(run_cli, tmp_path, "d.jsonl", *CASES["pool-zipf"])
    out = tmp_path / "c.json"
    doc = json.loads(run_cli("analyze", path, "--cache", "vllm-processor", "--json",
                             "--cache-size", "0.002,0.005", "--curve", out, "-q").output)
    curve = json.loads(out.read_bytes())["curve"]
    for row in doc["capacities"]:
        k = max(i for i, c in enumerate(curve["capacity_bytes"]) if c <= row["capacity_bytes"])
        for m, r in row["by_modality"].items():
            assert curve[f"{m}_hits"][k] == r["hits"] and \
                curve[f"{m}_tokens_saved"][k] == r["tokens_saved"]
        assert sum(curve[f"{m}_hits"][k] for m in row["by_modality"]) == curve["hits"][k]


@pytest.mark.parametrize("kind,plan_args", [
    ("pool", ["--num-requests", "40", "--pool-size", "6", "--reuse", "zipf", "--videos-per-request", "1",
              "--audios-per-request", "2", "--video-pool-size", "4"]),
    ("sliding-window", ["--users", "3", "--turns", "4", "--window", "2", "--videos-per-request",
                        "1", "--audios-per-request", "1"]),
])
def test_workload_plan_equals_the_dataset_it_generates(run_cli, tmp_path, kind, plan_args):
    """``--workload`` with videos and audio predicts what the generated dataset's manifest
    predicts: same items, same sizes, same hits."""
    sizing = ["--image-size", "32x24", "--video-size", "64x48", "--video-frames", "4",
              "--audio-duration", "0.25"]
    path = _gen(run_cli, tmp_path, "d.jsonl", kind, *plan_args, "--delivery", "path")
    common = ["--cache", "vllm-processor", "--cache-size", "0.001,0.004,1", "--json"]
    from_dataset = json.loads(run_cli("analyze", path, *common).output)
    from_plan = json.loads(run_cli("analyze", "--workload", kind, *plan_args, *sizing,
                                   *common).output)
    for key in ("references", "distinct_images", "distinct_bytes", "best", "capacities",
                "modalities", "thresholds"):
        assert from_plan[key] == from_dataset[key], key
    assert set(from_plan["modalities"]) == {"image", "audio", "video"}
    bad = run_cli("analyze", path, "--video-frames", "4")
    assert bad.exit_code == 2 and "--video-frames applies to --workload" in bad.output
