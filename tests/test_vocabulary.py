"""One vocabulary across commands: every flag names one setting (field), every setting has one
flag, older spellings are hidden aliases of the one flag, and lists have one syntax.

Walks the Click parameters of every command in ``mmdatagen.cli.COMMANDS``."""
from __future__ import annotations

import ast
import importlib
from collections import defaultdict
from pathlib import Path

import click
import pytest

from mmdatagen import cli

ROOT = Path(__file__).resolve().parents[1] / "mmdatagen"

#: Old spellings kept working: flag -> the field it sets (and is hidden wherever it is accepted).
ALIASES = {
    "--cache-gb": "cache_size", "--embedding-cache-gb": "cache_size",
    "--sweep-cache-gb": "cache_size", "--a-cache-gb": "a_cache_size",
    "--b-cache-gb": "b_cache_size", "--key-mode": "key", "--insert": "register",
    "--format": "dataset_type",
}
#: Commands that size a cache, and the flags they size it with.
SIZES_A_CACHE = {"analyze": ["--cache-size"], "bench": ["--cache-size"], "serve": ["--cache-size"],
                 "simulate": ["--cache-size"], "sweep": ["--cache-size"],
                 "ab": ["--a-cache-size", "--b-cache-size"]}


def _commands() -> dict[str, click.Command]:
    out = {}
    for name, target in cli.COMMANDS.items():
        module, attr = target.split(":")
        out[name] = getattr(importlib.import_module(module), attr)
    return out


def _rows() -> list[tuple[str, str, str, list[str]]]:
    """(command, field, primary flag, hidden spellings) for every option of every command."""
    rows = []
    for command, cmd in _commands().items():
        for p in cmd.params:
            if not isinstance(p, click.Option) or p.name is None:
                continue
            long = [o for o in p.opts if o.startswith("--")]
            shown = getattr(p, "_visible", None) or long
            primary = next(o for o in long if o in shown)
            rows.append((command, p.name, primary, [o for o in long if o not in shown]))
    return rows


ROWS = _rows()


def flag_table(rows=ROWS) -> str:
    """flag | field | commands | hidden spellings: the vocabulary as one table."""
    by_flag: dict[tuple[str, str], list[str]] = defaultdict(list)
    hidden: dict[tuple[str, str], set[str]] = defaultdict(set)
    for command, name, primary, aliases in rows:
        by_flag[primary, name].append(command)
        hidden[primary, name].update(aliases)
    return "\n".join(f"{flag} | {name} | {','.join(cmds)} | {','.join(sorted(hidden[flag, name]))}"
                     for (flag, name), cmds in sorted(by_flag.items()))


def test_walk_sees_every_command():
    assert {c for c, *_ in ROWS} == set(cli.COMMANDS)
    assert len(ROWS) > 300


def test_one_flag_names_one_field():
    """A flag (shown or hidden) sets the same field on every command that has it."""
    fields: dict[str, set[str]] = defaultdict(set)
    for _command, name, primary, aliases in ROWS:
        for flag in (primary, *aliases):
            fields[flag].add(name)
    shared = {flag: sorted(names) for flag, names in fields.items() if len(names) > 1}
    assert not shared, f"flags naming several fields: {shared}\n{flag_table()}"


def test_one_field_has_one_flag():
    """A field (one concept) is shown under the same flag on every command that has it."""
    flags: dict[str, set[str]] = defaultdict(set)
    for _command, name, primary, _ in ROWS:
        flags[name].add(primary)
    split = {name: sorted(f) for name, f in flags.items() if len(f) > 1}
    assert not split, f"fields with several flags: {split}\n{flag_table()}"


def test_a_shown_flag_is_never_another_commands_hidden_one():
    shown = {primary for _, _, primary, _ in ROWS}
    hidden = {a for *_, aliases in ROWS for a in aliases}
    assert not shown & hidden, sorted(shown & hidden)


@pytest.mark.parametrize("alias,field", sorted(ALIASES.items()))
def test_old_spellings_are_hidden_aliases_of_the_one_flag(alias, field):
    having = [(c, name, aliases) for c, name, _, aliases in ROWS if alias in aliases]
    assert having, f"{alias} is accepted by no command"
    assert all(name == field for _, name, _ in having), having
    assert not [c for c, _, primary, _ in ROWS if primary == alias], f"{alias} is shown"


@pytest.mark.parametrize("command", sorted(SIZES_A_CACHE))
def test_every_command_sizing_a_cache_takes_cache_size(command):
    cmd = _commands()[command]
    for flag in SIZES_A_CACHE[command]:
        param = next(p for p in cmd.params if flag in p.opts)
        assert param.name == flag[2:].replace("-", "_")
        help_text = cmd.get_help(click.Context(cmd, info_name=command))
        assert flag in help_text
        for old in ALIASES:
            assert f"{old} " not in help_text and f"{old}," not in help_text, (command, old)


def test_list_options_take_the_one_syntax(run_cli, tmp_path):
    """Repeat, comma and range spell the same list on every sweeping command."""
    from mmdatagen.settings.base import build
    from mmdatagen.settings.cache import SweepCache
    from mmdatagen.settings.sweep import SweepGrid

    grid = build(SweepGrid, {"concurrency": ("1,2", "4"), "cache_size": ("0:1:0.5",)})
    assert grid.axes() == {"concurrency": [1, 2, 4], "cache_gb": [0.0, 0.5, 1.0]}
    assert build(SweepCache, {"cache_size": ("0.5", "1,2")}).sizes() == [0.5, 1.0, 2.0]
    res = run_cli("analyze", "--workload", "pool", "--num-requests", "20", "--pool-size", "5",
                  "--cache-size", "0:0.001:0.0005", "--cache-gb", "1", "--json")
    assert res.exit_code == 0, res.output


def test_one_list_parser():
    """Only settings/values.py splits a list on commas (plans/sizes splits weighted size lists,
    report/svg SVG coordinates: not option lists)."""
    allowed = {"settings/values.py", "plans/sizes.py", "report/svg.py"}
    found = []
    for path in ROOT.rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            if (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute)
                    and node.func.attr == "split" and len(node.args) == 1  # not a maxsplit
                    and isinstance(node.args[0], ast.Constant) and node.args[0].value == ","):
                found.append(str(path.relative_to(ROOT)))
    assert set(found) <= allowed, sorted(set(found) - allowed)


def test_one_resolver_per_target_and_its_unit():
    from mmdatagen.caches import get_target
    from mmdatagen.errors import UserError

    enc, dyn = get_target("vllm-encoder"), get_target("dynamo-embedding")
    assert (enc.unit, dyn.unit) == ("tokens", "GiB")
    assert enc.resolve(None) == enc.default_capacity and enc.resolve(512) == 512
    assert enc.size_text(4096) == "4096 tokens" and dyn.size_text(None) == "10 GiB"
    with pytest.raises(UserError, match="finite"):
        dyn.resolve(float("nan"))


def test_units_are_printed_from_the_target(run_cli, tmp_path):
    """The console names the cache target's unit, not GiB for every cache."""
    from mmdatagen.console import _hit_lines

    data = tmp_path / "d.jsonl"
    assert run_cli("pool", "-n", 6, "--pool-size", 3, "--image-size", "32x32", "--text-tokens", 3,
                   "--tokenizer", "words", "-o", data, "-q").exit_code == 0
    res = run_cli("simulate", data, "--profile", "zero-delay", "--cache", "vllm-encoder",
                  "--cache-size", "1000,3000")
    assert res.exit_code == 0 and res.output.startswith("Cache tokens "), res.output
    res = run_cli("simulate", data, "--profile", "zero-delay", "--sweep-cache-gb", "0,1")
    assert res.exit_code == 0 and res.output.startswith("Cache GiB "), res.output
    res = run_cli("ab", "--input-file", data, "--profile", "zero-delay", "--request-count", 2,
                  "--warmup-request-count", 0, "--extra-inputs", "max_tokens:2", "--no-report",
                  "--a-cache-gb", 2, "--b-sim-arg=--cache=vllm-encoder", "--output-dir",
                  tmp_path / "ab")
    assert res.exit_code == 0, res.output
    assert "(profile zero-delay, cache dynamo-embedding 2 GiB)" in res.output
    assert "(profile zero-delay, cache vllm-encoder 0 tokens)" in res.output
    pred = {"hit_rate": 0.5, "hits": 1, "references": 2, "model": "m", "capacity": 4096,
            "unit": "tokens"}
    assert "(predicted, m, 4096 tokens): 1/2" in _hit_lines({"predicted": pred})[0]


ERRORS = ("UserError", "SpecError", "DatasetError", "RunFailed")
#: Library errors that still spell a flag (file -> how many): not settings of the failing call.
SPELLED = {"loadgen/merge_runs.py": 1,   # advice naming another command's flags
           "sim/calibrate_steps.py": 1}  # vLLM's flag, not ours: how to get its step lines


def _error_texts() -> list[tuple[str, str]]:
    """(file, text) of every error raised in the library (settings/, commands/, cli.py excluded):
    its string constants, f-string parts joined."""
    out = []
    for path in ROOT.rglob("*.py"):
        rel = str(path.relative_to(ROOT))
        if rel.startswith(("settings/", "commands/")) or rel == "cli.py":
            continue
        for node in ast.walk(ast.parse(path.read_text())):
            if (isinstance(node, ast.Raise) and isinstance(node.exc, ast.Call)
                    and getattr(node.exc.func, "id", None) in ERRORS):
                text = "".join(c.value for arg in node.exc.args for c in ast.walk(arg)
                               if isinstance(c, ast.Constant) and isinstance(c.value, str))
                out.append((rel, text))
    return out


def test_library_errors_name_fields_not_flags():
    """A library error names settings by field (SpecError(field, ...), `field` references in
    its text); the CLI edge spells the flags (settings.base.for_cli)."""
    import re

    spelled: dict[str, int] = defaultdict(int)
    for rel, text in _error_texts():
        if re.search(r"(?<![\w-])--[a-z]", text):
            spelled[rel] += 1
    assert dict(spelled) == SPELLED


def test_every_field_reference_is_a_setting():
    import re

    names = {name for _, name, _, _ in ROWS}
    refs = {(rel, ref) for rel, text in _error_texts() for ref in re.findall(r"`([a-z_]+)`", text)}
    assert refs and not [r for r in refs if r[1] not in names], sorted(refs)


def test_the_cli_edge_spells_references_as_flags(run_cli, tmp_path):
    from mmdatagen.errors import SpecError
    from mmdatagen.settings.base import for_cli

    exc = SpecError("ramp_to", "needs `benchmark_duration` or `request_count`; `grid_sim_params`")
    assert str(for_cli(exc)) == ("--ramp-to needs --benchmark-duration or --request-count; "
                                 "--sim-param")
    assert str(exc).startswith("ramp_to needs `benchmark_duration`")  # the library's wording
    data = tmp_path / "d.jsonl"
    data.write_text('{"text": "hi"}\n')
    res = run_cli("sweep", "--input-file", data, "--url", "http://127.0.0.1:9", "--model", "m",
                  "--cache-gb", "1,2", "--output-dir", tmp_path / "sw")
    assert res.exit_code == 2
    assert res.output.strip().splitlines()[-1] == (
        "error: --url is your server: sweep --cache-size and --sim-param only on the simulator "
        "(no --url)")


if __name__ == "__main__":  # the table for a review: python tests/test_vocabulary.py
    print(flag_table())
