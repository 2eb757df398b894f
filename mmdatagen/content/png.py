"""A minimal PNG encoder for pixels that cannot compress (noise): stored deflate blocks.

PIL's PNG writer filters and deflates every row, which costs ~10x more than the bytes are worth
for noise. This writes a valid 8-bit RGB PNG whose zlib stream uses stored blocks.
"""
from __future__ import annotations

import struct
import zlib

import numpy as np

PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"


def png_chunk(kind: bytes, data: bytes | memoryview) -> bytes:
    """One PNG chunk: length, type, data, CRC over type and data."""
    crc = zlib.crc32(data, zlib.crc32(kind))
    return b"".join((struct.pack(">I", len(data)), kind, data, struct.pack(">I", crc)))


def encode_png_stored(rgb: np.ndarray) -> bytes:
    """Encode an (H, W, 3) uint8 array as PNG with filter 0 and uncompressed deflate."""
    h, w, _ = rgb.shape
    rows = np.empty((h, w * 3 + 1), np.uint8)
    rows[:, 0] = 0
    rows[:, 1:] = rgb.reshape(h, w * 3)
    idat = zlib.compress(memoryview(rows).cast("B"), 0)
    header = struct.pack(">IIBBBBB", w, h, 8, 2, 0, 0, 0)
    return b"".join((PNG_SIGNATURE, png_chunk(b"IHDR", header), png_chunk(b"IDAT", idat),
                     png_chunk(b"IEND", b"")))
