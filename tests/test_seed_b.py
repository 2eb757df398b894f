"""The seed-B profiles (configs/profiles/seed-b-<gpu>-{vllm,fd,fd-ec}.yaml) reproduce the published
deltas of frontend decoding and of frontend decoding plus the embedding cache against plain
`vllm serve` (H100 and GB200, seed-workloads.md) within 5 percentage points, on the seed-B
workload (30 users x 8 turns, window 5, 2400x1080, 8,000 text tokens, concurrency 30, 240
requests, 1,024 forced output tokens); and frontend decoding is modelled as what it is: image
decoding leaves the serial frontend for a pool of decoders."""
from __future__ import annotations

import json

import pytest
from sim_datasets import write_sliding_dataset

from mmdatagen.cli import cli
from mmdatagen.metrics import build_export
from mmdatagen.sim.engine import Engine, SimImage, SimRequest
from mmdatagen.sim.profile import load_profile, profile_from_dict
from mmdatagen.sim.virtual import OutputPolicy, load_turns, simulate

# published deltas in percent vs plain `vllm serve` (only deltas were published)
PUBLISHED = {
    "h100": {"fd": {"rps": 12.8, "ttft": -60.4}, "fd-ec": {"rps": 29.8, "ttft": -66.4,
                                                           "ttft_p50": -87.4}},
    "gb200": {"fd": {"rps": 18.8, "ttft": -36.6}, "fd-ec": {"rps": 31.5, "ttft": -43.3,
                                                            "ttft_p50": -45.9}},
}
SIZES = {"vllm": 16384.0, "fd": 0.0, "fd-ec": 10.0}  # each arm's cache, in its target's unit
TOLERANCE_PP = 5.0


@pytest.fixture(scope="module")
def seed_b(tmp_path_factory):
    return write_sliding_dataset(tmp_path_factory.mktemp("seed_b") / "seed_b.jsonl")


@pytest.fixture(scope="module")
def turns(seed_b):
    """The dataset read once per cache target (an image's entry size is in its unit)."""
    read: dict[str, list] = {}

    def get(prof):
        if prof.cache not in read:
            read[prof.cache] = load_turns(seed_b, prof)
        return read[prof.cache]
    return get


def _metrics(turns, gpu: str, arm: str) -> dict[str, float]:
    prof = load_profile(f"seed-b-{gpu}-{arm}")
    res = simulate(turns(prof), prof, SIZES[arm], 30, 240, 0, OutputPolicy(1024, 1024, True),
                   wrap=False)
    ex = build_export(res.records, input_config={})
    return {"rps": ex["request_throughput"]["avg"], "ttft": ex["time_to_first_token"]["avg"],
            "ttft_p50": ex["time_to_first_token"]["p50"]}


@pytest.mark.parametrize("gpu", sorted(PUBLISHED))
def test_seed_b_profiles_reproduce_the_published_deltas(turns, gpu):
    base = _metrics(turns, gpu, "vllm")
    for arm, published in PUBLISHED[gpu].items():
        got = _metrics(turns, gpu, arm)
        for key, pub in published.items():
            delta = (got[key] / base[key] - 1) * 100
            assert abs(delta - pub) <= TOLERANCE_PP, (gpu, arm, key, round(delta, 1), pub)


def test_seed_b_profiles_of_one_gpu_share_their_hardware_costs():
    hardware = ("step_base_ms", "per_seq_ms", "per_prefill_token_ms", "per_encoder_token_ms",
                "per_encoder_image_ms", "encoder_async_fraction", "frontend_request_ms",
                "frontend_image_ms", "decode_ms_per_mpixel", "token_budget", "encoder_budget")
    for gpu in PUBLISHED:
        profs = {arm: load_profile(f"seed-b-{gpu}-{arm}") for arm in SIZES}
        for name in hardware:
            assert len({getattr(p, name) for p in profs.values()}) == 1, (gpu, name)
        assert profs["vllm"].decode_workers == 0  # vLLM decodes on its serial API server
        assert profs["fd"].decode_workers == profs["fd-ec"].decode_workers > 1
        assert "ONLY DELTAS ARE PUBLISHED" in open(
            f"configs/profiles/seed-b-{gpu}-vllm.yaml", encoding="utf-8").read()


def _ready_at(workers: int, images: int, mpix: float = 1.0) -> float:
    prof = profile_from_dict({"decode_ms_per_mpixel": 10.0, "decode_workers": workers,
                              "frontend_request_ms": 1.0, "frontend_image_ms": 2.0,
                              "cache": "dynamo-embedding"}, "decode")
    eng = Engine(prof, 0.0)
    ims = [SimImage(i, 100, 100, 1000, pixels=int(mpix * 1e6)) for i in range(images)]
    return eng.frontend_ready_at(SimRequest(0, 10, ims, 1), 0.0)


def test_image_decoding_is_serial_on_vllm_and_parallel_with_frontend_decoding():
    # serial frontend: 1 + 5 x (2 + 10)
    assert _ready_at(0, 5) == pytest.approx(61.0)
    # a pool of 8 decodes the 5 images at once (10 ms), then the serial rest: 1 + 5 x 2
    assert _ready_at(8, 5) == pytest.approx(21.0)
    # a pool of 2: three rounds of decoding (30 ms), then the serial rest
    assert _ready_at(2, 5) == pytest.approx(41.0)
    # priced per megapixel: a 2400x1080 image is 2.592 MP
    assert _ready_at(0, 1, 2.592) == pytest.approx(1 + 2 + 25.92)


def test_ab_takes_the_seed_b_profiles(seed_b, tmp_path):
    """`mmdatagen ab` runs a frontend-decoding arm (A) against the vLLM arm (B, the baseline
    ab's deltas are relative to) on the embedded simulator (a short run: 10 users, 10 requests, 8 output
    tokens); moving decoding off the serial path lowers the TTFT."""
    from click.testing import CliRunner

    out = tmp_path / "ab"
    res = CliRunner().invoke(cli, [
        "ab", "--input-file", str(seed_b), "--a-profile", "seed-b-h100-fd",
        "--a-cache-size", "0", "--b-profile", "seed-b-h100-vllm", "--b-cache-size", "16384",
        "--labels", "fd", "vllm", "--concurrency", "10", "--request-count", "10",
        "--warmup-request-count", "0", "--extra-inputs", "max_tokens:8",
        "--extra-inputs", "min_tokens:8", "--extra-inputs", "ignore_eos:true",
        "--time-scale", "0.1", "--output-dir", str(out), "--no-report", "--quiet"])
    assert res.exit_code == 0, res.output
    rows = json.loads((out / "comparison.json").read_text())["rows"]
    ttft = next(r for r in rows if (r["tag"], r["stat"]) == ("time_to_first_token", "avg"))
    assert ttft["delta_pct"] < -20, ttft
