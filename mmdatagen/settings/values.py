"""Option values with a syntax of their own: lists (``1,4,10``, ``0:20:2``), ``--extra-inputs
KEY:VALUE`` and ``--header K:V``.

Lists have one syntax on every command that takes several values (``analyze``'s capacities and
plan parameters, ``simulate --cache-size``, ``sweep``'s grid and ``--sim-param``): repeat the
flag, separate values by commas, or both; a number list also takes inclusive ranges
``start:stop[:step]``. :func:`list_items` splits, :func:`numbers` expands; nothing else parses a
list.
"""
from __future__ import annotations

import math
from collections.abc import Iterable
from typing import Any

import orjson

from ..errors import SpecError

#: The most values one list may expand to (a range like ``0:1e9`` is refused, not materialised).
MAX_VALUES = 100_000
LIST_HELP = "; repeat, list (1,4,10) or range start:stop[:step] (inclusive)."


def list_items(values: str | Iterable[str]) -> list[str]:
    """THE list syntax: ``("1,2", "4")`` or ``"1,2,4"`` -> ``["1", "2", "4"]`` (a flag repeated
    and/or comma-separated values; items stripped, empty ones dropped)."""
    raws = [values] if isinstance(values, str) else values
    return [item.strip() for raw in raws for item in str(raw).split(",") if item.strip()]


def numbers(values: str | Iterable[str], name: str, kind: type) -> list:
    """Field ``name``'s list of numbers of ``kind`` (int or float): :func:`list_items`, each
    item a number or an inclusive range ``start:stop[:step]``. A value given with nothing in it,
    a bad item, a non-finite number or a value given twice is a ``SpecError`` naming the field
    (ranges and bounds: :func:`settings.base.check_field`)."""
    out: list = []
    for raw in [values] if isinstance(values, str) else values:
        items = list_items(raw)
        if not items:
            raise SpecError(name, f"takes numbers, got {raw!r}")
        for item in items:
            out += _expand(item, kind, name)
    if len(set(out)) != len(out):
        raise SpecError(name, f"repeats a value: {', '.join(map(str, out))}")
    return out


def _expand(item: str, kind: type, name: str) -> list:
    try:
        if ":" not in item:
            vals = [kind(item)]
        else:
            vals = _range(item, [kind(p) for p in item.split(":")], kind, name)
        if not all(math.isfinite(v) for v in vals):
            raise ValueError
        return vals
    except (ValueError, OverflowError):
        raise SpecError(name, f"has a bad value {item!r}; expected a number, a list 1,2,4 or a "
                        "range start:stop[:step]") from None


def _range(item: str, parts: list, kind: type, name: str) -> list:
    if len(parts) not in (2, 3) or (len(parts) == 3 and parts[2] <= 0):
        raise ValueError
    lo, hi = parts[0], parts[1]
    step = parts[2] if len(parts) == 3 else 1
    count = int((hi - lo) / step + 1e-9) + 1
    if count < 1:
        raise SpecError(name, f"range {item!r} is empty (start above stop)")
    if count > MAX_VALUES:
        raise SpecError(name, f"range {item!r} has more than {MAX_VALUES:,} values")
    return [kind(round(lo + i * step, 9)) for i in range(count)]


def coerce_value(text: str) -> Any:
    """AIPerf-style coercion of an ``--extra-inputs`` value: bool, int, float, JSON, else str."""
    low = text.strip().lower()
    if low in ("true", "false"):
        return low == "true"
    if low in ("null", "none"):
        return None
    for cast in (int, float):
        try:
            return cast(text)
        except ValueError:
            pass
    if text[:1] in "[{\"":
        try:
            return orjson.loads(text)
        except orjson.JSONDecodeError:
            pass
    return text


def parse_extra_inputs(pairs: tuple[str, ...] | list[str]) -> dict[str, Any]:
    """``["max_tokens:150", "ignore_eos:true", '{"a": 1}']`` -> ordered dict with coerced values."""
    out: dict[str, Any] = {}
    for pair in pairs:
        pair = pair.strip()
        if pair.startswith("{"):
            try:
                obj = orjson.loads(pair)
            except orjson.JSONDecodeError:
                raise SpecError("extra_inputs", f"{pair!r} is not valid JSON") from None
            if not isinstance(obj, dict):
                raise SpecError("extra_inputs", "JSON must be an object")
            out.update(obj)
            continue
        key, sep, value = pair.partition(":")
        if not sep or not key.strip():
            raise SpecError("extra_inputs", f"expects KEY:VALUE, got {pair!r}")
        out[key.strip()] = coerce_value(value.strip())
    for key, value in out.items():
        problem = json_problem(value)
        if problem is not None:
            raise SpecError("extra_inputs", f"{key}: {problem}")
    return out


INT64 = (-(1 << 63), (1 << 63) - 1)


def json_problem(value: Any) -> str | None:
    """Why ``value`` cannot travel in a request body as the same JSON number it was given
    (NaN and infinities are no JSON; integers beyond 64 bits no server reads), or None."""
    if isinstance(value, bool) or value is None or isinstance(value, str):
        return None
    if isinstance(value, int):
        return None if INT64[0] <= value <= INT64[1] else f"{value:.3g} is beyond the 64-bit " \
                                                          "integer range"
    if isinstance(value, float):
        return None if math.isfinite(value) else f"{value} is not a finite number"
    if isinstance(value, dict):
        return next((p for v in value.values() if (p := json_problem(v)) is not None), None)
    if isinstance(value, list):
        return next((p for v in value if (p := json_problem(v)) is not None), None)
    return f"{type(value).__name__} is not a JSON value"


def parse_headers(pairs: tuple[str, ...] | list[str]) -> dict[str, str]:
    """``--header K:V`` pairs -> dict (first colon splits)."""
    out: dict[str, str] = {}
    for pair in pairs:
        key, sep, value = pair.partition(":")
        if not sep or not key.strip() or any(c in pair for c in "\r\n"):
            raise SpecError("headers", f"expects KEY:VALUE, got {pair!r}")
        out[key.strip()] = value.strip()
    return out


def check_labels(labels: tuple[str, ...]) -> None:
    """Run labels (``ab``/``compare --labels``) go into Markdown, JSON and HTML: printable text
    of valid UTF-8, one line, at most 80 characters."""
    for label in labels:
        try:
            label.encode("utf-8")
        except UnicodeEncodeError:
            raise SpecError("labels", f"{label.encode('utf-8', 'surrogateescape')!r} is not "
                                      "valid UTF-8") from None
        if not label.strip() or not label.isprintable() or len(label) > 80:
            raise SpecError("labels", f"{label[:40]!r} must be one line of 1 to 80 printable "
                                      "characters")
