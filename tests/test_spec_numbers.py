"""Every numeric option of every command refuses NaN, infinities and out-of-range values with one
line and exit code 2, before doing any work (the spec layer checks every number in one place)."""
from __future__ import annotations

import importlib
import sys

import click
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from mmdatagen import cli
from mmdatagen.settings.base import FLOAT_MAX, INT_MAX
from mmdatagen.settings.cli import SpecOption

# what a command needs besides the option under test to get as far as checking it
REQUIRED = {"bench": ["--input-file", "missing.jsonl"], "ab": ["--input-file", "missing.jsonl"],
            "simulate": ["missing.jsonl"], "compare": ["a", "b"],
            "sweep": ["--input-file", "missing.jsonl"]}


def _commands() -> dict[str, click.Command]:
    out = {}
    for name, target in cli.COMMANDS.items():
        module, attr = target.split(":")
        out[name] = getattr(importlib.import_module(module), attr)
    return out


def _numeric() -> list[tuple[str, click.Option]]:
    found = []
    for name, command in _commands().items():
        for param in command.params:
            if isinstance(param.type, (click.types.IntParamType, click.types.FloatParamType)):
                found.append((name, param))
    return found


NUMERIC = _numeric()


def test_every_numeric_option_is_declared_in_a_spec():
    loose = [f"{name} {p.opts[-1]}" for name, p in NUMERIC if not isinstance(p, SpecOption)]
    assert not loose, f"numeric options outside the spec layer: {loose}"
    assert len(NUMERIC) > 40  # the generators, serve, simulate, bench, ab, analyze, sweep


def _bad_values(param: SpecOption) -> list[str]:
    opt, kind = param.spec_opt, param.spec_kind
    hi = opt.max if opt.max is not None else (INT_MAX if kind is int else FLOAT_MAX)
    bad = [str(hi * 10 + 1) if kind is float else str(int(hi) + 1), "99999999999999999999999"]
    if opt.min is not None:
        bad.append(str(opt.min) if opt.min_open else str(opt.min - 1))
    if kind is float:
        bad += ["nan", "inf", "-inf", "NaN"]
        if opt.max_open:
            bad.append(str(opt.max))
    return bad


CASES = [(name, p, v) for name, p in NUMERIC if isinstance(p, SpecOption) for v in _bad_values(p)]


def run_cli(args: list[str], monkeypatch, capsys) -> tuple[int, str]:
    monkeypatch.setattr(sys, "argv", ["mmdatagen", *args])
    with pytest.raises(SystemExit) as exc:
        cli.main()
    return exc.value.code, capsys.readouterr().err


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(case=st.sampled_from(CASES))
def test_bad_number_is_one_line_exit_2(case, monkeypatch, capsys, tmp_path_factory):
    name, param, value = case
    monkeypatch.chdir(tmp_path_factory.mktemp("cwd"))
    flag = param.spec_opt.flag
    code, err = run_cli([name, *REQUIRED.get(name, []), f"{flag}={value}"], monkeypatch, capsys)
    lines = err.strip().splitlines()
    assert code == 2, (name, flag, value, err)
    assert len(lines) == 1 and lines[0].startswith("error: "), err
    assert "Traceback" not in err


def test_every_case_is_drawn_at_least_once_in_a_sweep(monkeypatch, capsys, tmp_path):
    """Hypothesis samples; this walks every (command, option) once with its worst value."""
    monkeypatch.chdir(tmp_path)
    seen = set()
    for name, param, value in CASES:
        if (name, param.name) in seen:
            continue
        seen.add((name, param.name))
        flag = param.spec_opt.flag
        bad = "nan" if param.spec_kind is float else value
        code, err = run_cli([name, *REQUIRED.get(name, []), f"{flag}={bad}"], monkeypatch, capsys)
        assert code == 2 and err.count("\n") == 1 and err.startswith("error: "), (name, flag, err)
        assert param.spec_opt.flag in err, (flag, err)
    assert len(seen) == len({(n, p.name) for n, p in NUMERIC})
