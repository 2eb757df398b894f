"""The run object (settings.run.BenchRun): what an export records of it, the embedded simulator's
settings derived from it, and the checks run_bench makes before it starts anything."""
from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import pytest

from mmdatagen.errors import SpecError, UserError
from mmdatagen.loadgen.run import check_run
from mmdatagen.loadgen.setup import bench_run
from mmdatagen.settings.base import build
from mmdatagen.settings.cache import BenchCache, Geometry
from mmdatagen.settings.load import BenchTarget, Load, LoadShard
from mmdatagen.settings.run import BenchRun

#: The export's input_config, key by key in this order: exports written before BenchRun have it
#: so, merge-runs digests it, and sweep.origin.json compares it.
INPUT_CONFIG_KEYS = [
    "input_file", "model", "url", "dataset_type", "concurrency", "request_count",
    "warmup_request_count", "extra_inputs", "streaming", "output_dir", "request_rate", "arrival",
    "burstiness", "ramp_to", "benchmark_duration", "request_timeout", "headers",
    "endpoint_type", "profile", "cache_gb", "cache", "cache_explicit", "encoder_budget",
    "metrics_url", "reset_cache", "num_shards", "shard_index", "start_at", "shard_digest",
    "model_path", "geometry", "sim_args", "time_scale", "http_client", "grace_period", "seed",
    "quiet", "predict", "fixed_schedule", "image_cache_bytes", "goodput", "metrics_interval",
    "max_response_bytes", "api_key_set"]


@pytest.fixture
def data(tmp_path: Path) -> Path:
    path = tmp_path / "d.jsonl"
    path.write_text('{"text": "hi"}\n')
    return path


def test_public_is_the_export_contract(data, tmp_path):
    load = build(Load, {"input_file": data, "model": "m", "api_key": "sekret",
                        "headers": ("X-Api-Token:abc", "X-Trace:1"),
                        "extra_inputs": ("max_tokens:5", '{"ignore_eos": true}'),
                        "max_response_mb": 2.0, "no_predict": True})
    run = bench_run(load, BenchTarget(url="http://127.0.0.1:9", output_dir=tmp_path / "o"),
                    BenchCache(cache="vllm-processor", cache_size=0.5),
                    Geometry(patch_size=14, dtype="float32"), LoadShard(num_shards=2),
                    ("ttft:300",))
    pub = run.public()
    assert list(pub) == INPUT_CONFIG_KEYS
    assert "sekret" not in repr(pub) and pub["api_key_set"] is True
    assert pub["headers"] == {"X-Api-Token": "<redacted>", "X-Trace": "1"}
    assert pub["extra_inputs"] == {"max_tokens": 5, "ignore_eos": True}
    assert pub["cache"] == "vllm-processor" and pub["cache_explicit"] is True
    assert pub["cache_gb"] == 0.5 and pub["geometry"] == {"patch_size": 14, "dtype_bytes": 4}
    assert pub["max_response_bytes"] == 2 << 20 and pub["predict"] is False
    assert pub["goodput"] == {"time_to_first_token": 300.0} and pub["num_shards"] == 2
    default = BenchRun(replace(load, headers=(), api_key=None)).public()
    assert default["cache"] == "dynamo-embedding" and default["cache_explicit"] is False
    assert default["cache_gb"] is None and default["api_key_set"] is False


def test_simulator_settings_derive_from_the_run(data):
    load = build(Load, {"input_file": data, "profile": "zero-delay", "time_scale": 2.0,
                        "sim_args": ("--cache-size", "3", "--max-running", "4")})
    run = bench_run(load, cache=BenchCache(cache_size=1.0, encoder_budget=99),
                    geometry=Geometry(hidden_size=128))
    sim = run.simulator()
    assert sim.engine.profile == "zero-delay" and sim.server.time_scale == 2.0
    assert sim.cache.cache_size == 3.0  # --sim-arg is laid over the run's own value
    assert sim.cache.encoder_budget == 99 and sim.cache.cache is None  # the profile's target
    assert sim.engine.max_running == 4 and sim.geometry.hidden_size == 128
    assert run.load.model == "Qwen/Qwen3-VL-30B-A3B-Instruct-FP8"  # the simulator's model
    with pytest.raises(UserError, match="--sim-arg: --cache-size must not be negative"):
        bench_run(replace(load, sim_args=("--cache-size", "-1")))


def test_the_prediction_sizes_the_cache_the_simulator_runs(data):
    """The embedded simulator's cache as ``--sim-arg`` leaves it (size, geometry) is the one the
    loader's prediction replays; before, it took the run's own size (the default 10 GiB where
    the simulator ran 3) and geometry."""
    from mmdatagen.loadgen.predict import prediction_setup

    load = build(Load, {"input_file": data, "sim_args": ("--cache-size", "3",
                                                         "--hidden-size", "1024")})
    run = bench_run(load, geometry=Geometry(hidden_size=2048))
    tracker, note = prediction_setup(run.load.model, run.cache, run.geometry, None, run.simulator())
    assert note is None and tracker is not None
    assert tracker.target.name == "dynamo-embedding" and tracker.capacity == 3.0
    assert tracker.model.hidden_size == 1024
    tracker, _ = prediction_setup(run.load.model, run.cache, run.geometry, None)  # the run's own
    assert tracker is not None and tracker.capacity == 10 and tracker.model.hidden_size == 2048


def test_check_run_refuses_what_needs_several_specs(data, tmp_path):
    load = build(Load, {"input_file": data, "model": "m"})
    run = BenchRun(load, BenchTarget(output_dir=tmp_path / "o"))
    check_run(run)
    with pytest.raises(SpecError, match="metrics_url"):
        check_run(replace(run, target=BenchTarget(metrics_url="http://x")))
    with pytest.raises(SpecError, match="ramp_to"):
        check_run(replace(run, load=replace(load, dataset_type="random_pool", request_rate=1.0,
                                            ramp_to=2.0)))
    with pytest.raises(SpecError, match="shard_index"):
        check_run(replace(run, shard=LoadShard(num_shards=2, shard_index=2)))
    with pytest.raises(SpecError, match="model"):
        check_run(replace(run, load=replace(load, model=None)))
    with pytest.raises(UserError, match="input file not found"):
        check_run(replace(run, load=replace(load, input_file=tmp_path / "nope.jsonl")))
    with pytest.raises(SpecError, match="required with `url`"):
        bench_run(replace(load, model=None), BenchTarget(url="http://127.0.0.1:9"))


def test_a_run_whose_output_is_its_input_is_refused_before_and_under_the_lock(data, tmp_path):
    """``bench_run`` (ab's two runs before either starts) and ``run_bench`` itself (a run made
    in code), under its folder's lock: the input intact, the lock gone."""
    from mmdatagen.loadgen.run import run_bench

    out = tmp_path / "o"
    out.mkdir()
    (out / "records.jsonl").write_bytes(data.read_bytes())
    load = build(Load, {"input_file": out / "records.jsonl", "model": "m", "quiet": True})
    with pytest.raises(UserError, match="is an input of this run"):
        bench_run(load, BenchTarget(output_dir=out))
    with pytest.raises(UserError, match="is an input of this run"):
        run_bench(BenchRun(load, BenchTarget(output_dir=out)))
    assert (out / "records.jsonl").read_bytes() == data.read_bytes()
    assert sorted(p.name for p in out.parent.iterdir()) == ["d.jsonl", "o"]  # no lock left


def test_the_specs_read_their_key_value_strings_once(data):
    """``--extra-inputs`` and ``--header`` are parsed by the spec that holds them, once: its
    validation refuses a bad one naming the field, and every reader shares the one parse
    (the export's copy cannot change what the requests send)."""
    from mmdatagen.settings.sim import VirtualRun

    load = build(Load, {"input_file": data, "model": "m", "headers": ("X-A: 1:2",),
                        "extra_inputs": ("max_tokens:5", '{"ignore_eos": true}')})
    assert load.extras == {"max_tokens": 5, "ignore_eos": True}
    assert load.extras is load.extras and load.header_map == {"X-A": "1:2"}
    pub = BenchRun(load).public()
    pub["extra_inputs"]["max_tokens"] = 99
    assert load.extras["max_tokens"] == 5
    assert replace(load, extra_inputs=("min_tokens:2",)).extras == {"min_tokens": 2}
    for cls, values in ((Load, {"input_file": data, "extra_inputs": ("novalue",)}),
                        (Load, {"input_file": data, "headers": ("nocolon",)}),
                        (VirtualRun, {"extra_inputs": ('{"a": [1',)})):
        with pytest.raises(SpecError) as err:
            build(cls, values)
        assert err.value.name == ("headers" if "headers" in values else "extra_inputs")
