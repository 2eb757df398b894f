"""Seeded randomness derived from (seed, purpose, index) so any shard can be produced alone."""
from __future__ import annotations

import zlib

import numpy as np

# Purposes: each stream of randomness gets its own constant so streams never overlap.
PLAN, IMAGE, TEXT, SIZE, ORDER = (zlib.crc32(p.encode()) for p in ("plan", "image", "text", "size", "order"))
# Video and audio items: their pixels/samples, their plans (pool draws) and their sizes.
VIDEO, AUDIO, VIDEO_PLAN, AUDIO_PLAN, VIDEO_SIZE = (
    zlib.crc32(p.encode()) for p in ("video", "audio", "video-plan", "audio-plan", "video-size"))


def rng_for(seed: int, purpose: int, *index: int) -> np.random.Generator:
    """An independent generator for one purpose and index (e.g. image 17 of seed 0)."""
    return np.random.Generator(np.random.PCG64(np.random.SeedSequence([seed, purpose, *index])))
