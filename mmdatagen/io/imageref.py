"""Image references as engines see them: data URLs, http(s) URLs, local paths; keys and sizes.

Shared by the analysis (identify images in any dataset), the simulator (key its cache) and the
loader (encode local files once).
"""
from __future__ import annotations

import base64
import binascii
import io
import os
from dataclasses import dataclass
from pathlib import Path

import blake3

from ..errors import DatasetError

KEY_MODES = ("bytes", "pixels", "reference", "uuid")


@dataclass(frozen=True)
class ImageRef:
    """A parsed reference: ``kind`` is ``data``, ``url`` or ``path``."""

    kind: str
    text: str
    mime: str = ""


def parse_ref(ref: str) -> ImageRef:
    """Classify a reference string the way AIPerf does (``file://`` and raw base64 rejected)."""
    if ref.startswith("data:"):
        head, _, _ = ref.partition(",")
        if ";base64" not in head:
            raise DatasetError("data URLs must be base64-encoded")
        return ImageRef("data", ref, head[5:].split(";")[0])
    if ref.startswith("file://"):
        raise DatasetError(f"file:// URLs are not accepted by AIPerf: {ref[:80]}")
    if "://" in ref:
        return ImageRef("url", ref)
    return ImageRef("path", ref)


def decode_data_url(ref: str) -> bytes:
    """The encoded image bytes inside a base64 data URL."""
    _, sep, payload = ref.partition(",")
    if not sep:
        raise DatasetError("malformed data URL (no comma)")
    try:
        return base64.b64decode(payload, validate=True)
    except (binascii.Error, ValueError):
        raise DatasetError("malformed base64 in data URL") from None


def resolve_path(ref: str, dataset_dir: Path | None) -> Path:
    """A local path as AIPerf resolves it (working directory), else against the dataset's folder."""
    path = Path(os.path.expanduser(ref))
    if path.is_absolute() or path.exists() or dataset_dir is None:
        return path
    alt = dataset_dir / path
    return alt if alt.exists() else path


def load_bytes(ref: str, dataset_dir: Path | None = None) -> bytes | None:
    """Encoded bytes of a data URL or local file; None for http(s) URLs (the server fetches)."""
    parsed = parse_ref(ref)
    if parsed.kind == "data":
        return decode_data_url(ref)
    if parsed.kind == "url":
        return None
    path = resolve_path(ref, dataset_dir)
    try:
        return path.read_bytes()
    except OSError as exc:
        raise DatasetError(f"cannot read image {ref}: {exc.strerror}") from None


def image_dims(data: bytes) -> tuple[int, int]:
    """(width, height) from the image header, without decoding pixels."""
    from PIL import Image, UnidentifiedImageError

    try:
        with Image.open(io.BytesIO(data)) as img:
            return img.size
    except (UnidentifiedImageError, OSError):
        raise DatasetError("unsupported or corrupt image data") from None


HEADER_B64_CHARS = 1 << 16  # base64 characters decoded to read dimensions (48 KiB of image)


def data_url_dims(payload: str | bytes) -> tuple[int, int]:
    """(width, height) of a base64 image payload, decoding only its first 48 KiB when the
    header is there (it almost always is), else the whole payload."""
    raw = payload.encode("ascii", "replace") if isinstance(payload, str) else payload
    if len(raw) > HEADER_B64_CHARS:
        try:
            return image_dims(base64.b64decode(raw[:HEADER_B64_CHARS]))
        except (DatasetError, binascii.Error, ValueError):
            pass
    try:
        data = base64.b64decode(raw)
    except (binascii.Error, ValueError):
        raise DatasetError("malformed base64 in data URL") from None
    return image_dims(data)


def bytes_key(data: bytes) -> str:
    """vLLM-style key: a hash of the original encoded bytes."""
    return blake3.blake3(data).hexdigest()


def pixel_key(data: bytes) -> str:
    """Dynamo-style key: a hash of geometry plus decoded RGB pixels (encoding-independent)."""
    from PIL import Image, UnidentifiedImageError

    try:
        with Image.open(io.BytesIO(data)) as img:
            rgb = img.convert("RGB")
    except (UnidentifiedImageError, OSError):
        raise DatasetError("unsupported or corrupt image data") from None
    h = blake3.blake3(f"{rgb.width}x{rgb.height}:RGB:".encode())
    h.update(rgb.tobytes())
    return h.hexdigest()


def reference_key(ref: str) -> str:
    """Dynamo-disaggregated key: a hash of the reference string itself."""
    return blake3.blake3(ref.encode()).hexdigest()
