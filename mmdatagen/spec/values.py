"""Option values with a syntax of their own: ``--extra-inputs KEY:VALUE`` and ``--header K:V``.

Shared by the loader (``bench``, ``ab``, ``sweep``) and ``simulate``.
"""
from __future__ import annotations

import math
from typing import Any

import orjson

from ..errors import UserError


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
                raise UserError(f"--extra-inputs {pair!r} is not valid JSON") from None
            if not isinstance(obj, dict):
                raise UserError("--extra-inputs JSON must be an object")
            out.update(obj)
            continue
        key, sep, value = pair.partition(":")
        if not sep or not key.strip():
            raise UserError(f"--extra-inputs expects KEY:VALUE, got {pair!r}")
        out[key.strip()] = coerce_value(value.strip())
    for key, value in out.items():
        problem = json_problem(value)
        if problem is not None:
            raise UserError(f"--extra-inputs {key}: {problem}")
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
            raise UserError(f"--header expects KEY:VALUE, got {pair!r}")
        out[key.strip()] = value.strip()
    return out


def check_labels(labels: tuple[str, ...]) -> None:
    """Run labels (``ab``/``compare --labels``) go into Markdown, JSON and HTML: printable text
    of valid UTF-8, one line, at most 80 characters."""
    from ..errors import SpecError

    for label in labels:
        try:
            label.encode("utf-8")
        except UnicodeEncodeError:
            raise SpecError("labels", f"{label.encode('utf-8', 'surrogateescape')!r} is not "
                                      "valid UTF-8") from None
        if not label.strip() or not label.isprintable() or len(label) > 80:
            raise SpecError("labels", f"{label[:40]!r} must be one line of 1 to 80 printable "
                                      "characters")
