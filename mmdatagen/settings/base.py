"""The spec machinery: option fields, Click options generated from them, one validation pass.

A spec is a frozen dataclass whose fields are declared with :func:`option`. The field metadata
carries everything the CLI and the validator need (flag, help, bounds, choices, alias spellings),
so a concept is declared once and every command that uses it gets the same name, default, help
and checks. Library code sees only the dataclass; errors raised by :func:`validate` name the
field (``num_requests``) and are re-worded with the flag (``--num-requests``) at the CLI edge.
"""
from __future__ import annotations

import dataclasses
import math
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeVar

from ..errors import SpecError, UserError

T = TypeVar("T")

#: The bound every integer option gets unless it declares a tighter one (int64-safe, and far
#: beyond anything a dataset or a run needs).
INT_MAX = 2**31 - 1
#: The same for floats that declare no maximum (seconds, rates, GiB...).
FLOAT_MAX = 1e12


def for_cli(exc: SpecError) -> UserError:
    """The same error, naming the field's flag (the CLI edge), and the flag of every other field
    its text refers to (:func:`flags_in`)."""
    return UserError(f"{flag_for(exc.name)} {flags_in(exc.problem)}")


#: A reference to another setting in an error text: its field name in backticks.
_FIELD_REF = re.compile(r"`([a-z][a-z0-9_]*)`")


def flags_in(text: str) -> str:
    """A library error text as the command line reads it: each `` `field` `` reference becomes
    the field's flag (``needs `request_rate``` -> ``needs --request-rate``). Library code names
    settings by field, so a flag's spelling lives in its spec alone."""
    return _FIELD_REF.sub(lambda m: flag_for(m.group(1)), text)


@dataclass(frozen=True)
class Opt:
    """How one spec field appears on the command line and which values it accepts."""

    flag: str
    help: str = ""
    kind: Any = None                     # int | float | str | bool | Path; None: from default
    short: str | None = None             # "-n"
    aliases: tuple[str, ...] = ()        # other accepted spellings, hidden from --help
    choices: tuple[str, ...] | None = None
    min: float | None = None
    max: float | None = None
    min_open: bool = False               # the minimum itself is refused (> min, not >= min)
    max_open: bool = False               # the maximum itself is refused (< max)
    required: bool = False
    multiple: bool = False
    nargs: int = 1
    is_flag: bool = False
    negatable: bool = False              # --x/--no-x
    envvar: str | None = None
    show_envvar: bool = False
    metavar: str | None = None
    show_default: bool | str = True
    file_okay: bool = True
    dir_okay: bool = True
    item: Any = None                     # int | float: a list of numbers (settings.values syntax)

    def bound_text(self) -> str:
        lo = "" if self.min is None else (">" if self.min_open else ">=") + f" {_num(self.min)}"
        hi = "" if self.max is None else ("<" if self.max_open else "<=") + f" {_num(self.max)}"
        return " and ".join(p for p in (lo, hi) if p)


def list_option(flag: str, help: str, item: type | None = None, metavar: str = "LIST",
                **kw: Any) -> Any:
    """A field taking several values in the one list syntax (``settings.values.list_items``: repeat
    the flag and/or separate by commas). With ``item`` (int or float) the values are numbers
    (ranges ``start:stop[:step]`` too), each checked against ``min``/``max`` (default: >= 0).
    The field holds the strings as given; :func:`expand` expands them."""
    if item is not None:
        kw.setdefault("min", 0)
    return option((), flag, help, kind=str, multiple=True, metavar=metavar, show_default=False,
                  item=item, **kw)


def expand(cls: type, name: str, values: tuple[str, ...]) -> list:
    """The values of ``cls``'s list field ``name`` expanded and checked (numbers for a field
    with an ``item`` kind); a bad one is a ``SpecError`` naming the field."""
    f = next(f for f, _ in opts_of(cls) if f.name == name)
    return _list_of(f, f.metadata["opt"], values)


def _list_of(f: dataclasses.Field, opt: Opt, value: tuple) -> list:
    from .values import list_items, numbers

    if opt.item is None:
        return list_items(value)
    return [check_value(f.name, opt, opt.item, v) for v in numbers(value, f.name, opt.item)]


def _num(x: float) -> str:
    return f"{int(x):,}" if float(x).is_integer() and abs(x) >= 1e4 else f"{x:g}"


def option(default: Any, flag: str, help: str = "", **kw: Any) -> Any:
    """A spec field: its default and how it looks on the command line (see :class:`Opt`)."""
    if isinstance(default, (list, dict, set)):
        raise TypeError("spec defaults must be immutable (use a tuple)")
    return field(default=default, metadata={"opt": Opt(flag, help, **kw)})


# field name -> flag, across every spec: one name per concept, so one table.
_FLAGS: dict[str, str] = {}


def spec(cls: type[T]) -> type[T]:
    """Register a spec class's flags (for errors at the CLI edge); apply it above
    ``@dataclass(frozen=True)``, which type checkers understand."""
    out = cls if dataclasses.is_dataclass(cls) else dataclass(frozen=True)(cls)
    for f, opt in opts_of(out):
        _FLAGS.setdefault(f.name, opt.flag)
    return out


def flag_for(name: str) -> str:
    return _FLAGS.get(name, "--" + name.replace("_", "-"))


def opts_of(cls: type) -> list[tuple[dataclasses.Field, Opt]]:
    return [(f, f.metadata["opt"]) for f in dataclasses.fields(cls) if "opt" in f.metadata]


# ---------------------------------------------------------------------------------------------
# validation


def field_kind(f: dataclasses.Field, opt: Opt) -> Any:
    if opt.kind is not None:
        return opt.kind
    if opt.is_flag or opt.negatable:
        return bool
    d = f.default
    if isinstance(d, bool):
        return bool
    if isinstance(d, (int, float, str)):
        return type(d)
    return str


def _as_bool(name: str, value: Any) -> bool:
    if not isinstance(value, bool):
        raise SpecError(name, f"must be true or false, got {value!r}")
    return value


def _as_int(name: str, value: Any) -> int:
    if isinstance(value, float) and value.is_integer():
        return int(value)
    if isinstance(value, bool) or not isinstance(value, int):
        raise SpecError(name, f"must be an integer, got {value!r}")
    return value


def _as_float(name: str, value: Any) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise SpecError(name, f"must be a number, got {value!r}")
    if not math.isfinite(value):
        raise SpecError(name, f"must be a finite number, got {value}")
    return float(value)


def _as_text(name: str, opt: Opt, value: Any) -> str | Path:
    if not isinstance(value, (str, Path)):
        raise SpecError(name, f"must be a string, got {value!r}")
    if "\x00" in str(value):
        raise SpecError(name, "must not contain a NUL character")
    if opt.choices is not None and value not in opt.choices:
        raise SpecError(name, f"must be one of {', '.join(opt.choices)}, got {value!r}")
    return value


def _in_range(name: str, opt: Opt, kind: Any, value: float) -> None:
    hi = opt.max if opt.max is not None else (INT_MAX if kind is int else FLOAT_MAX)
    lo = opt.min
    if lo == 0 and not opt.min_open and value < 0:
        raise SpecError(name, f"must not be negative, got {_num(value)}")
    low = lo is not None and (value < lo or (opt.min_open and value == lo))
    if low or value > hi or (opt.max_open and value == hi):
        bounds = dataclasses.replace(opt, max=hi).bound_text()
        raise SpecError(name, f"must be {bounds}, got {_num(value)}")


def check_value(name: str, opt: Opt, kind: Any, value: Any) -> Any:
    """One value against its field: type, finiteness, range, choices. Returns it (coerced)."""
    if value is None:
        return None
    if kind is bool:
        return _as_bool(name, value)
    if kind is Path:
        return Path(_as_text(name, opt, value))
    if kind not in (int, float):
        return _as_text(name, opt, value)
    number = _as_int(name, value) if kind is int else _as_float(name, value)
    _in_range(name, opt, kind, number)
    return number


def check_field(f: dataclasses.Field, opt: Opt, value: Any) -> Any:
    """A field's value checked (one value, or each of a multiple/nargs option's values)."""
    kind = field_kind(f, opt)
    if not (opt.multiple or opt.nargs > 1):
        return check_value(f.name, opt, kind, value)
    if value is None:
        return None
    if not isinstance(value, (tuple, list)):
        raise SpecError(f.name, f"must be a list, got {value!r}")
    checked = tuple(check_value(f.name, opt, kind, v) for v in value)
    if opt.item is not None:
        _list_of(f, opt, checked)  # every number parses and is in range, or one error
    return checked


def validate(spec: T) -> T:
    """Every field checked against its metadata, then the spec's own cross-field ``check()``."""
    changes = {}
    for f, opt in opts_of(type(spec)):
        checked = check_field(f, opt, getattr(spec, f.name))
        if checked is not getattr(spec, f.name):
            changes[f.name] = checked
    if changes:
        spec = dataclasses.replace(spec, **changes)  # type: ignore[type-var]
    check = getattr(spec, "check", None)
    if check is not None:
        check()
    return spec


def check_values(cls: type, **values: Any) -> None:
    """Values checked against the fields of ``cls`` of the same name (library entry points that
    take plain arguments use the same rules as the specs)."""
    by_name = {f.name: (f, opt) for f, opt in opts_of(cls)}
    for name, value in values.items():
        f, opt = by_name[name]
        check_field(f, opt, value)


def build(cls: type[T], values: Mapping[str, Any], **overrides: Any) -> T:
    """A validated spec from a mapping that may hold more keys than the spec has fields."""
    names = {f.name for f in dataclasses.fields(cls)}  # type: ignore[arg-type]
    spec = cls(**{k: v for k, v in {**values, **overrides}.items() if k in names})
    return validate(spec)
