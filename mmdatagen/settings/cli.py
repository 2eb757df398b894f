"""The CLI edge of the spec layer: Click options generated from spec fields, ``--config`` presets,
and errors re-worded with flag names."""
from __future__ import annotations

import dataclasses
from collections.abc import Callable, Iterable, Mapping
from pathlib import Path
from typing import Any, TypeVar

import click

from ..errors import UserError
from .base import (
    Opt,
    SpecError,
    build,
    check_field,
    field_kind,
    flags_in,
    for_cli,
    opts_of,
)

T = TypeVar("T")
Decorator = Callable[[Callable[..., Any]], Callable[..., Any]]


class SpecOption(click.Option):
    """A Click option whose alias spellings are accepted but left out of ``--help``."""

    def __init__(self, *args: Any, visible: list[str] | None = None, spec_opt: Opt | None = None,
                 spec_kind: Any = None, **kw: Any) -> None:
        super().__init__(*args, **kw)
        self._visible = visible
        self.spec_opt, self.spec_kind = spec_opt, spec_kind  # what the option accepts (tests)

    def get_help_record(self, ctx: click.Context) -> tuple[str, str] | None:
        if not self._visible:
            return super().get_help_record(ctx)
        opts = self.opts
        self.opts = [o for o in opts if o in self._visible]
        try:
            return super().get_help_record(ctx)
        finally:
            self.opts = opts


def options(*classes: type, defaults: Mapping[str, Any] | None = None,
            skip: Iterable[str] = (), help: Mapping[str, str] | None = None,
            only: Iterable[str] | None = None) -> Decorator:
    """One Click option per field of ``classes`` (declaration order).

    ``defaults`` overrides a field's default for this command (shown in ``--help``); ``skip``
    leaves fields out (``only`` keeps just the named ones); ``help`` replaces a field's help
    for this command.
    """
    defaults = dict(defaults or {})
    helps = dict(help or {})
    skipped = set(skip)
    if only is not None:
        kept = set(only)
        skipped |= {f.name for cls in classes for f, _ in opts_of(cls) if f.name not in kept}
    decorators = [_click_option(f, opt, defaults.get(f.name, f.default), helps.get(f.name, opt.help))
                  for cls in classes for f, opt in opts_of(cls) if f.name not in skipped]

    def apply(fn: Callable[..., Any]) -> Callable[..., Any]:
        for dec in reversed(decorators):
            fn = dec(fn)
        return fn
    return apply


def _click_type(f: dataclasses.Field, opt: Opt) -> Any:
    kind = field_kind(f, opt)
    if opt.choices is not None:
        return click.Choice(opt.choices)
    if kind is Path or not (opt.file_okay and opt.dir_okay):
        return click.Path(path_type=Path if kind is Path else None, file_okay=opt.file_okay,
                          dir_okay=opt.dir_okay)
    return {int: click.INT, float: click.FLOAT}.get(kind, click.STRING)


def _click_option(f: dataclasses.Field, opt: Opt, default: Any, text: str) -> Decorator:
    flag = f"{opt.flag}/--no-{opt.flag[2:]}" if opt.negatable else opt.flag
    visible = [d for d in (opt.short, opt.flag) if d]
    kw: dict[str, Any] = {"help": text, "cls": SpecOption, "visible": visible, "spec_opt": opt,
                          "spec_kind": field_kind(f, opt)}
    if opt.is_flag:
        kw.update(is_flag=True, default=bool(default))
    else:
        if not opt.negatable:
            kw["type"] = _click_type(f, opt)
        kw["default"] = default
        if opt.multiple:
            kw["multiple"] = True
        if opt.nargs > 1:
            kw["nargs"] = opt.nargs
        if opt.required:
            kw["required"] = True
        if isinstance(opt.show_default, str) or (default is not None and opt.show_default):
            kw["show_default"] = opt.show_default
    if opt.envvar:
        kw.update(envvar=opt.envvar, show_envvar=opt.show_envvar)
    if opt.metavar:
        kw["metavar"] = opt.metavar
    decls = [d for d in (opt.short, flag, *opt.aliases) if d]
    return click.option(*decls, f.name, **kw)


def make(cls: type[T], values: Mapping[str, Any], **overrides: Any) -> T:
    """:func:`build` at the CLI edge: a field error becomes a one-line error naming the flag."""
    try:
        return build(cls, values, **overrides)
    except SpecError as exc:
        raise for_cli(exc) from None


def given_flags(classes: Iterable[type], args: Iterable[str], prog: str) -> dict[str, Any]:
    """The fields set by a command line of ``classes``' flags (strings, as a user typed them),
    parsed by the same generated options; fields not on that line (defaults, environment
    variables) are absent. A parse error is a ``UserError`` (Click's one-line message)."""
    from click.core import ParameterSource

    command = options(*classes)(click.Command(prog, params=[]))
    assert isinstance(command, click.Command)
    try:
        ctx = command.make_context(prog, list(args), resilient_parsing=False)
    except click.ClickException as exc:
        raise UserError(exc.format_message()) from None
    return {name: value for name, value in ctx.params.items()
            if ctx.get_parameter_source(name) == ParameterSource.COMMANDLINE}


# ---------------------------------------------------------------------------------------------
# --config presets: they override defaults only; every value is checked like a flag's value


def preset_defaults(path_or_name: str, classes: Iterable[type], source: str | None = None
                    ) -> dict[str, Any]:
    """A preset's values keyed by field name, each checked against its field.

    A key is a field name or its flag without dashes (``image-size`` or ``image_size``); unknown
    keys, wrong YAML types and out-of-range values are one-line errors naming the key and file.
    """
    from ..presets import find_config, load_yaml

    path = find_config(path_or_name)
    data = load_yaml(path)
    fields = {}
    for cls in classes:
        for f, opt in opts_of(cls):
            for alias in (f.name, opt.flag, *opt.aliases):
                fields[alias.lstrip("-").replace("-", "_")] = (f, opt)
    out: dict[str, Any] = {}
    for key, value in data.items():
        hit = fields.get(str(key).replace("-", "_"))
        if hit is None:
            raise UserError(f"unknown key {key!r} in config {source or path_or_name}")
        f, opt = hit
        if isinstance(value, list) and f.name == "image_size":
            value = ",".join(str(v) for v in value)
        if isinstance(value, int) and not isinstance(value, bool) and field_kind(f, opt) is float:
            value = float(value)
        try:
            out[f.name] = check_field(f, opt, value)
        except SpecError as exc:
            raise UserError(f"config {source or path_or_name}: key {key!r} "
                            f"{flags_in(exc.problem)}") from None
    return out


PRESET_READ = "mmdatagen.preset_path"  # ctx.meta key: the --config file a command read


def config_option(*classes: type, name: str = "config") -> Decorator:
    """Eager ``--config PRESET``: the YAML supplies defaults; flags on the command line win."""

    def load(ctx: click.Context, _param: click.Parameter, value: str | None) -> str | None:
        if value:
            from ..presets import find_config

            defaults = preset_defaults(value, classes)
            ctx.default_map = {**(ctx.default_map or {}), **defaults}
            ctx.meta[PRESET_READ] = find_config(value)  # an input of the run: never written over
        return value

    return click.option(f"--{name}", "preset", callback=load, is_eager=True, expose_value=False,
                        help="YAML preset (path or name of a shipped preset in configs/); "
                             "flags override it.")
