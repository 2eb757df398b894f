"""A minimal PNG encoder for pixels that cannot compress (noise): stored deflate blocks.

PIL's PNG writer filters and deflates every row, which costs ~10x more than the bytes are worth
for noise. This writes a valid 8-bit RGB PNG whose zlib stream is made of stored blocks, each
holding whole rows, so the pixels are copied once into the final buffer and never re-scanned
except by the two checksums.
"""
from __future__ import annotations

import struct
import zlib

import numpy as np
import numpy.typing as npt

U8 = npt.NDArray[np.uint8]

PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"
MAX_STORED = 65535


def png_chunk(kind: bytes, data: bytes | memoryview) -> bytes:
    """One PNG chunk: length, type, data, CRC over type and data."""
    crc = zlib.crc32(data, zlib.crc32(kind))
    return b"".join((struct.pack(">I", len(data)), kind, data, struct.pack(">I", crc)))


def _stored_zlib(pixels: U8) -> U8:
    """A zlib stream of stored blocks over pixel rows ``(rows, row_bytes)``, each row prefixed by
    filter byte 0; every block holds whole rows, so pixels are copied once."""
    rows, row_bytes = pixels.shape
    stride = row_bytes + 1
    if stride > MAX_STORED:  # a row longer than one block: let zlib cut the blocks
        raw = np.zeros((rows, stride), np.uint8)
        raw[:, 1:] = pixels
        return np.frombuffer(zlib.compress(raw.data.cast("B"), 0), np.uint8)
    per_block = MAX_STORED // stride
    starts = range(0, rows, per_block)
    total = 2 + sum(5 + min(per_block, rows - r) * stride for r in starts) + 4
    out = np.zeros(total, np.uint8)
    out[0:2] = (0x78, 0x01)
    pos, adler = 2, 1
    for r in starts:
        k = min(per_block, rows - r)
        n = k * stride
        last = r + k >= rows
        out[pos:pos + 5] = np.frombuffer(struct.pack("<BHH", last, n, n ^ 0xFFFF), np.uint8)
        block = out[pos + 5:pos + 5 + n]
        block.reshape(k, stride)[:, 1:] = pixels[r:r + k]
        adler = zlib.adler32(block.data, adler)
        pos += 5 + n
    out[pos:pos + 4] = np.frombuffer(struct.pack(">I", adler), np.uint8)
    return out


def encode_png_stored(rgb: U8) -> bytes:
    """Encode an (H, W, 3) uint8 array as PNG with filter 0 and uncompressed deflate."""
    h, w, _ = rgb.shape
    return _assemble(w, h, _stored_zlib(rgb.reshape(h, w * 3)))


def _assemble(w: int, h: int, idat: U8) -> bytes:
    header = struct.pack(">IIBBBBB", w, h, 8, 2, 0, 0, 0)
    crc = zlib.crc32(idat.data, zlib.crc32(b"IDAT"))
    return b"".join((PNG_SIGNATURE, png_chunk(b"IHDR", header), struct.pack(">I", len(idat)),
                     b"IDAT", idat.data, struct.pack(">I", crc), png_chunk(b"IEND", b"")))
