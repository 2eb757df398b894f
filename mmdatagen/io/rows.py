"""AIPerf row objects and their serialisation (compact orjson, one object per line)."""
from __future__ import annotations

from typing import Any

import orjson


def turn_object(text: str, images: list[str], uuids: list[str] | None = None,
                session_id: str | None = None, output_length: int | None = None,
                videos: list[str] | None = None, audios: list[str] | None = None) -> dict[str, Any]:
    """One AIPerf single_turn object (also a ``turns`` entry of multi_turn)."""
    obj: dict[str, Any] = {}
    if session_id is not None:
        obj["session_id"] = session_id
    if text:
        obj["text"] = text
    if images:
        obj["images"] = images
    if uuids:
        obj["image_uuids"] = uuids
    if videos:
        obj["videos"] = videos
    if audios:
        obj["audios"] = audios
    if output_length is not None:
        obj["output_length"] = output_length
    return obj


def session_object(session_id: str, turns: list[dict[str, Any]]) -> dict[str, Any]:
    """One AIPerf multi_turn line: a session and its turns (history is added by the client)."""
    return {"session_id": session_id, "turns": turns}


def dumps_line(obj: dict[str, Any]) -> bytes:
    """A JSONL line (compact, newline-terminated)."""
    return orjson.dumps(obj, option=orjson.OPT_APPEND_NEWLINE)
