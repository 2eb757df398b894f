"""Local image files as AIPerf sends them: re-encoded, as a base64 data URL.

Shared by the loader (``loadgen/payload.py``) and the simulator's probe, so neither imports the
other.
"""
from __future__ import annotations

import base64
import io
from pathlib import Path

from ..errors import DatasetError


def encode_file(path: Path) -> str:
    """Re-encode a PNG/JPEG file like AIPerf: JPEG q85 subsampling 0, PNG compress_level 6."""
    from PIL import Image, UnidentifiedImageError

    try:
        with Image.open(path) as img:
            fmt = (img.format or "").upper()
            if fmt not in ("PNG", "JPEG"):
                raise DatasetError(f"{path}: only PNG and JPEG files are accepted (got {fmt or '?'})")
            buf = io.BytesIO()
            if fmt == "JPEG":
                rgb = img if img.mode in ("RGB", "L", "CMYK") else img.convert("RGB")
                rgb.save(buf, format="JPEG", quality=85, subsampling=0)
                mime = "jpeg"
            else:
                img.save(buf, format="PNG", compress_level=6)
                mime = "png"
    except FileNotFoundError:
        raise DatasetError(f"image file not found: {path}") from None
    except (UnidentifiedImageError, OSError) as exc:
        raise DatasetError(f"cannot read image {path}: {exc}") from None
    return f"data:image/{mime};base64,{base64.b64encode(buf.getvalue()).decode('ascii')}"
