"""Small seed-A-shaped datasets for the simulator's tests and calibration script.

Rows follow the seeds' pool rule (``plans.pool_plan``: first pass unique, then uniform); images
are tiny solid-colour PNGs of the stated size (pixel-distinct per pool id, a few KB each), so a
dataset of 1,000 rows is written in well under a second. Text is ``text_tokens`` x
``bytes_per_token`` bytes of words (6 by default: ``mmdatagen pool``'s 400-token texts measure
about 2,420 bytes), i.e. ``text_tokens`` under a profile with the same ``text_bytes_per_token``.
"""
from __future__ import annotations

import base64
import io
from pathlib import Path

import orjson

WORDS = ("time", "year", "people", "way", "day", "man", "thing", "woman", "life", "child",
         "world", "school", "state", "family", "group", "country", "problem", "hand", "part")


def png_data_url(pool_id: int, width: int, height: int) -> str:
    from PIL import Image

    colour = (pool_id % 256, (pool_id // 256) % 256, 128 + (pool_id * 7) % 128)
    buf = io.BytesIO()
    Image.new("RGB", (width, height), colour).save(buf, "PNG")
    return "data:image/png;base64," + base64.b64encode(buf.getvalue()).decode()


def text_of(tokens: int, offset: int = 0, bytes_per_token: int = 6) -> str:
    size = tokens * bytes_per_token
    out, n, i = [], 0, offset
    while n < size:
        w = WORDS[i % len(WORDS)]
        out.append(w)
        n += len(w) + 1
        i += 1
    return " ".join(out)[:size]


def write_pool_dataset(path: Path, num_requests: int = 1000, pool_size: int = 200,
                       size: tuple[int, int] = (640, 480), text_tokens: int = 400,
                       seed: int = 0) -> list[int]:
    """Write a single_turn JSONL; returns the pool id of each row's image (file order)."""
    from ..plans.pool import pool_plan

    plan = pool_plan(num_requests=num_requests, pool_size=pool_size, images_per_request=1,
                     image_size=f"{size[0]}x{size[1]}", seed=seed)
    ids = [int(x) for x in plan.image_ids[:, 0]]
    urls = {i: png_data_url(i, *size) for i in set(ids)}
    with open(path, "wb") as fh:
        fh.writelines(orjson.dumps({"text": text_of(text_tokens, row), "image": urls[i]}) + b"\n" for row, i in enumerate(ids))
    return ids
