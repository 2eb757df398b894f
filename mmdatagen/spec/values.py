"""Option values with a syntax of their own: ``--extra-inputs KEY:VALUE`` and ``--header K:V``.

Shared by the loader (``bench``, ``ab``, ``sweep``) and ``simulate``.
"""
from __future__ import annotations

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
    return out


def parse_headers(pairs: tuple[str, ...] | list[str]) -> dict[str, str]:
    """``--header K:V`` pairs -> dict (first colon splits)."""
    out: dict[str, str] = {}
    for pair in pairs:
        key, sep, value = pair.partition(":")
        if not sep or not key.strip() or any(c in pair for c in "\r\n"):
            raise UserError(f"--header expects KEY:VALUE, got {pair!r}")
        out[key.strip()] = value.strip()
    return out
