"""The sweep's spec layer: the grid's lists (settings.sweep.SweepGrid, settings.values' one syntax), the --sim-param axes
(loadgen.sweep) and the config built from the specs."""
from __future__ import annotations

from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from mmdatagen.errors import SpecError
from mmdatagen.loadgen.sweep import parse_sim_params, sweep_config
from mmdatagen.settings.base import build, for_cli
from mmdatagen.settings.load import Load
from mmdatagen.settings.sweep import SweepGrid, SweepTarget


@given(st.lists(st.integers(1, 10**6), min_size=1, max_size=8, unique=True),
       st.lists(st.floats(0.001, 1e4, allow_nan=False), min_size=1, max_size=5, unique=True))
def test_axes_keep_values_and_order(conc, gbs):
    grid = SweepGrid(concurrency=(", ".join(map(str, conc)),),
                     cache_size=tuple(repr(g) for g in gbs))  # comma list, repeated flag
    assert grid.axes() == {"concurrency": conc, "cache_gb": gbs}
    assert list(grid.axes()) == ["concurrency", "cache_gb"]  # grid order, not argument order


@pytest.mark.parametrize("field, text, flag_message", [
    ("concurrency", "1,x", "--concurrency has a bad value 'x'; expected a number, a list "
                           "1,2,4 or a range start:stop[:step]"),
    ("concurrency", "2.5", "--concurrency has a bad value '2.5'; expected a number, a list "
                           "1,2,4 or a range start:stop[:step]"),
    ("concurrency", "0,4", "--concurrency must be >= 1 and <= 1,000,000, got 0"),
    ("concurrency", "4,4", "--concurrency repeats a value: 4, 4"),
    ("request_rate", " , ", "--request-rate takes numbers, got ' , '"),
    ("request_rate", "0", "--request-rate must be >= 0.001 and <= 1,000,000, got 0"),
    ("cache_size", "1,-1", "--cache-size must not be negative, got -1"),
])
def test_bad_lists_name_the_field_then_the_flag(field, text, flag_message):
    with pytest.raises(SpecError) as exc:
        build(SweepGrid, {field: (text,)})
    assert exc.value.name == field
    assert str(for_cli(exc.value)) == flag_message


def test_sim_params_are_profile_fields_with_typed_values():
    assert parse_sim_params(["max_running=32,52", "key_mode=bytes,pixels",
                             "step_base_ms=2.5"]) == {
        "max_running": [32, 52], "key_mode": ["bytes", "pixels"], "step_base_ms": [2.5]}
    with pytest.raises(SpecError, match="profile field"):
        parse_sim_params(["nope=1"])
    with pytest.raises(SpecError, match="max_running needs at least one value"):
        parse_sim_params(["max_running= , "])


def test_config_from_specs(tmp_path):
    data = tmp_path / "d.jsonl"
    data.write_text('{"text": "hi"}\n')
    load = build(Load, {"input_file": data, "seed": 7, "quiet": False})
    cfg = sweep_config(load, build(SweepGrid, {"concurrency": ("1,2",),
                                               "grid_sim_params": ("max_running=4",)}),
                       build(SweepTarget, {"output_dir": tmp_path / "sw"}), 3,
                       goodput=("ttft:100",))
    assert cfg.grid == {"concurrency": [1, 2], "max_running": [4]}
    assert cfg.repeats == 3 and cfg.target.output_dir == Path(tmp_path / "sw") and not cfg.quiet
    base = cfg.base
    assert base.load.quiet and base.load.seed == 7
    assert base.cache.cache_size == 10.0  # dynamo-embedding's default, in GiB
    assert base.slos == (("time_to_first_token", 100.0),)
    assert cfg.expand() == [{"concurrency": 1, "max_running": 4},
                                         {"concurrency": 2, "max_running": 4}]


@pytest.mark.parametrize("profile, sim_args, url, cache, size", [
    ("qwen3-vl-30b-gb200", (), None, None, 10.0),  # dynamo-embedding: 10 GiB
    ("seed-b-gb200-vllm", (), None, None, 8192.0),  # vllm-encoder: 8,192 tokens, not 10
    ("qwen3-vl-30b-gb200", ("--cache=sglang-vlm",), None, None, 100.0),  # --sim-arg's target
    ("qwen3-vl-30b-gb200", (), "http://127.0.0.1:9", "vllm-processor", 4.0),  # the prediction's
])
def test_a_sweep_that_does_not_sweep_the_cache_sizes_it_as_its_target_does(
        tmp_path, profile, sim_args, url, cache, size):
    """Where the grid has no cache size, every run takes the default of the cache it sizes, in
    that cache's unit (a fixed 10 read as tokens was an encoder cache of 10 tokens)."""
    from dataclasses import replace

    from mmdatagen.loadgen.sweep import base_cache_size

    data = tmp_path / "d.jsonl"
    data.write_text('{"text": "hi"}\n')
    load = build(Load, {"input_file": data, "profile": profile, "sim_args": sim_args,
                        "model": "m" if url else None})
    cfg = sweep_config(load, build(SweepGrid, {"concurrency": ("1",)}),
                       build(SweepTarget, {"output_dir": tmp_path / "sw", "url": url}), 1)
    if cache is not None:
        cfg = replace(cfg, base=replace(cfg.base, cache=replace(cfg.base.cache, cache=cache,
                                                                 cache_size=None)))
        assert base_cache_size(cfg.base) == size
    else:
        assert cfg.base.cache.cache_size == size

