"""Image materialisation: deterministic pixels per (seed, image id), encoded as JPEG or PNG.

Every pool image differs in its pixels, not only its bytes (Dynamo keys on pixels, vLLM on the
encoded bytes): noise differs by construction, the other contents carry the image id stamped
into a corner.
"""
from __future__ import annotations

import io
import struct
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path

import numpy as np
from PIL import Image, ImageDraw, ImageOps

from .. import rng
from ..errors import SpecError, UserError
from .png import encode_png_stored, png_chunk

CONTENTS = ("noise", "photo", "solid", "folder", "hf")
FORMATS = ("png", "jpeg")
MIME = {"png": "image/png", "jpeg": "image/jpeg"}
EXTENSION = {"png": "png", "jpeg": "jpg"}
FOLDER_SUFFIXES = {".png", ".jpg", ".jpeg", ".webp", ".bmp", ".gif", ".tif", ".tiff"}
_GRAIN_MARGIN = 128


@dataclass(frozen=True)
class ImageStyle:
    """How pool images look and are encoded."""

    content: str = "noise"
    fmt: str = "png"
    quality: int = 85
    png_compress_level: int | None = None   # None: stored for noise, 6 (AIPerf's) otherwise
    target_bytes: int | None = None
    folder: str | None = None
    hf_dataset: str | None = None
    hf_image_column: str = "image"

    def validate(self) -> None:
        if self.content not in CONTENTS:
            raise UserError(f"unknown image content {self.content!r}; choose from {', '.join(CONTENTS)}")
        if self.fmt not in FORMATS:
            raise UserError(f"unknown image format {self.fmt!r}; choose from {', '.join(FORMATS)}")
        if not 1 <= self.quality <= 100:
            raise SpecError("jpeg_quality", f"must be in 1..100, got {self.quality}")
        if self.png_compress_level is not None and not 0 <= self.png_compress_level <= 9:
            raise SpecError("png_compress_level", "must be in 0..9")
        if self.target_bytes is not None and self.target_bytes <= 0:
            raise SpecError("target_bytes", "must be positive")
        if self.content == "folder":
            folder_files(self.folder)
        if self.content == "hf":
            hf_images(self.hf_dataset, self.hf_image_column)

    @property
    def mime(self) -> str:
        return MIME[self.fmt]

    @property
    def extension(self) -> str:
        return EXTENSION[self.fmt]


def folder_files(folder: str | None) -> tuple[Path, ...]:
    """Image files of a user folder, sorted by name (a UserError when there are none)."""
    if not folder:
        raise SpecError("image_source_dir", "is required for image content 'folder'")
    return _folder_files(str(folder))


@lru_cache(maxsize=4)
def _folder_files(folder: str) -> tuple[Path, ...]:
    base = Path(folder)
    if not base.is_dir():
        raise UserError(f"image source folder {folder} does not exist")
    files = tuple(sorted(p for p in base.iterdir() if p.suffix.lower() in FOLDER_SUFFIXES))
    if not files:
        raise UserError(f"image source folder {folder} holds no image files")
    return files


def hf_images(path: str | None, column: str):
    """The image column of a local Hugging Face dataset (``save_to_disk`` folder), undecoded."""
    if not path:
        raise SpecError("hf_dataset", "is required for image content 'hf' (a save_to_disk folder)")
    return _hf_images(str(path), column)


@lru_cache(maxsize=2)
def _hf_images(path: str, column: str):
    from datasets import Image as HFImage
    from datasets import load_from_disk

    if not Path(path).is_dir():
        raise UserError(f"Hugging Face dataset {path} does not exist")
    try:
        ds = load_from_disk(path)
    except (FileNotFoundError, ValueError) as exc:
        raise UserError(f"cannot load Hugging Face dataset {path}: {exc}".splitlines()[0]) from None
    if not hasattr(ds, "column_names"):
        raise SpecError("hf_dataset", f"{path} is a DatasetDict: give one split's folder")
    if column not in ds.column_names:
        raise UserError(f"Hugging Face dataset {path} has no column {column!r}; "
                        f"columns: {', '.join(ds.column_names)}")
    if not isinstance(ds.features[column], HFImage):
        raise UserError(f"column {column!r} of {path} is not an Image feature")
    if len(ds) == 0:
        raise UserError(f"Hugging Face dataset {path} has no rows")
    return ds.select_columns([column]).cast_column(column, HFImage(decode=False))


def _stamp(img: Image.Image, image_id: int) -> None:
    """Write the id's 32 bits as black/white 4x4 squares along the top-left edge."""
    draw = ImageDraw.Draw(img)
    cell = 4 if img.width >= 128 else 1
    for bit in range(min(32, img.width // cell)):
        on = (image_id >> bit) & 1
        x = bit * cell
        draw.rectangle([x, 0, x + cell - 1, cell - 1], fill=(255, 255, 255) if on else (0, 0, 0))


def noise_pixels(seed: int, image_id: int, width: int, height: int) -> np.ndarray:
    """Uniform RGB noise, (H, W, 3) uint8."""
    n = width * height * 3
    raw = np.random.PCG64(np.random.SeedSequence([seed, rng.IMAGE, image_id])).random_raw(n // 8 + 1)
    return raw.view(np.uint8)[:n].reshape(height, width, 3)


@lru_cache(maxsize=8)
def _grain_field(width: int, height: int) -> Image.Image:
    """A fixed index field (vertical ramp plus film grain), cropped per image at an offset."""
    g = np.random.default_rng(0x5EED)
    h, w = height + _GRAIN_MARGIN, width + _GRAIN_MARGIN
    ramp = (np.arange(h, dtype=np.uint16)[:, None] * 192 // h)
    field = np.minimum(ramp + g.integers(0, 64, (h, w), dtype=np.uint16), 255).astype(np.uint8)
    return Image.fromarray(field, "L")


def photo_image(seed: int, image_id: int, width: int, height: int) -> Image.Image:
    """A photo-like synthetic scene: graded sky-to-ground colours with grain, and shapes."""
    g = rng.rng_for(seed, rng.IMAGE, image_id)
    ox, oy = (int(v) for v in g.integers(0, _GRAIN_MARGIN, 2))
    idx = _grain_field(width, height).crop((ox, oy, ox + width, oy + height))
    top, bottom = g.integers(0, 256, 3), g.integers(0, 256, 3)
    ramp = np.linspace(0.0, 1.0, 256)[:, None]
    palette = (top * (1 - ramp) + bottom * ramp).astype(np.uint8)
    pimg = Image.frombuffer("P", (width, height), idx.tobytes(), "raw", "P", 0, 1)
    pimg.putpalette(palette.tobytes())
    img = pimg.convert("RGB")
    draw = ImageDraw.Draw(img)
    for _ in range(int(g.integers(4, 12))):
        x0, y0 = int(g.integers(0, width)), int(g.integers(0, height))
        rw = int(g.integers(max(1, width // 24), max(2, width // 4)))
        rh = int(g.integers(max(1, height // 24), max(2, height // 3)))
        colour = tuple(int(c) for c in g.integers(0, 256, 3))
        shape = int(g.integers(0, 3))
        if shape == 0:
            draw.ellipse([x0, y0, x0 + rw, y0 + rh], fill=colour)
        elif shape == 1:
            draw.rectangle([x0, y0, x0 + rw, y0 + rh], fill=colour)
        else:
            draw.polygon([(x0, y0), (x0 + rw, y0 + rh // 3), (x0 + rw // 2, y0 + rh)], fill=colour)
    _stamp(img, image_id)
    return img


def solid_image(seed: int, image_id: int, width: int, height: int) -> Image.Image:
    """One flat colour, distinct per image id (the id's low 24 bits mixed with the seed)."""
    value = (image_id * 0x9E3779B1 + seed * 0x85EBCA6B) & 0xFFFFFF
    img = Image.new("RGB", (width, height), (value >> 16, (value >> 8) & 0xFF, value & 0xFF))
    _stamp(img, image_id)
    return img


def folder_image(folder: str, seed: int, image_id: int, width: int, height: int) -> Image.Image:
    """A user image resized to cover W x H; slots beyond the file count use another crop/flip."""
    files = folder_files(folder)
    path = files[image_id % len(files)]
    try:
        with Image.open(path) as opened:
            src = ImageOps.exif_transpose(opened).convert("RGB")
    except OSError:
        raise UserError(f"cannot read image {path}") from None
    return _fit_slot(src, seed, image_id, image_id // len(files), width, height)


def hf_image(path: str, column: str, seed: int, image_id: int, width: int, height: int) -> Image.Image:
    """A dataset image resized to cover W x H; slots beyond the row count use another crop/flip."""
    images = hf_images(path, column)
    entry = images[image_id % len(images)][column]
    try:
        data = entry["bytes"] if entry.get("bytes") else Path(entry["path"]).read_bytes()
        with Image.open(io.BytesIO(data)) as opened:
            src = ImageOps.exif_transpose(opened).convert("RGB")
    except (OSError, TypeError):
        raise UserError(f"cannot read image {image_id % len(images)} of {path}") from None
    return _fit_slot(src, seed, image_id, image_id // len(images), width, height)


def _fit_slot(src: Image.Image, seed: int, image_id: int, variant: int, width: int,
              height: int) -> Image.Image:
    """Cover W x H (centred for the first use of a source, a seeded crop/flip after); stamp the id."""
    g = rng.rng_for(seed, rng.IMAGE, image_id)
    cx, cy = (0.5, 0.5) if variant == 0 else (float(v) for v in g.random(2))
    img = ImageOps.fit(src, (width, height), Image.Resampling.BICUBIC, centering=(cx, cy))
    if variant % 2 == 1:
        img = ImageOps.mirror(img)
    _stamp(img, image_id)
    return img


def _pad(data: bytes, fmt: str, target: int) -> bytes:
    """Grow an encoded image to exactly ``target`` bytes with ignorable metadata."""
    extra = target - len(data)
    if extra == 0:
        return data
    if fmt == "png":
        if extra < 12:
            raise SpecError("target_bytes", f"{target} cannot be reached exactly (PNG is {len(data)} bytes)")
        end = len(data) - 12  # before IEND
        return data[:end] + png_chunk(b"mmPd", bytes(extra - 12)) + data[end:]
    segments = []
    while extra > 0:  # JPEG COM segments right after SOI: 4 header bytes + up to 65533 payload
        if extra < 4:
            raise SpecError("target_bytes", f"{target} cannot be reached exactly (JPEG is {len(data)} bytes)")
        take = min(extra, 65537)
        if 0 < extra - take < 4:
            take -= 4
        segments.append(b"\xff\xfe" + struct.pack(">H", take - 2) + bytes(take - 4))
        extra -= take
    return data[:2] + b"".join(segments) + data[2:]


class ImageFactory:
    """Renders and encodes pool images; pure function of (style, seed, id, size)."""

    def __init__(self, style: ImageStyle, seed: int) -> None:
        style.validate()
        self.style, self.seed = style, seed

    def render(self, image_id: int, width: int, height: int) -> np.ndarray | Image.Image:
        """Pixels of one image (numpy for noise, PIL otherwise)."""
        content, seed = self.style.content, self.seed
        if content == "noise":
            return noise_pixels(seed, image_id, width, height)
        if content == "photo":
            return photo_image(seed, image_id, width, height)
        if content == "solid":
            return solid_image(seed, image_id, width, height)
        if content == "hf":
            return hf_image(str(self.style.hf_dataset), self.style.hf_image_column, seed,
                            image_id, width, height)
        return folder_image(str(self.style.folder), seed, image_id, width, height)

    def _encode(self, pixels: np.ndarray | Image.Image, quality: int) -> bytes:
        style = self.style
        if style.fmt == "png":
            level = style.png_compress_level
            if level is None:
                level = 0 if style.content == "noise" else 6
            if level == 0:
                arr = pixels if isinstance(pixels, np.ndarray) else np.asarray(pixels.convert("RGB"))
                return encode_png_stored(arr)
            img = Image.fromarray(pixels) if isinstance(pixels, np.ndarray) else pixels
            buf = io.BytesIO()
            img.save(buf, "PNG", compress_level=level)
            return buf.getvalue()
        img = Image.fromarray(pixels) if isinstance(pixels, np.ndarray) else pixels
        buf = io.BytesIO()
        img.save(buf, "JPEG", quality=quality)
        return buf.getvalue()

    def encode(self, image_id: int, width: int, height: int) -> bytes:
        """Encoded bytes of one image, padded or re-qualified to ``target_bytes`` when set."""
        pixels = self.render(image_id, width, height)
        style = self.style
        data = self._encode(pixels, style.quality)
        target = style.target_bytes
        if target is None or len(data) == target:
            return data
        if len(data) > target and style.fmt == "jpeg":
            lo, hi, best = 1, style.quality - 1, None
            while lo <= hi:  # highest quality that fits
                mid = (lo + hi) // 2
                candidate = self._encode(pixels, mid)
                if len(candidate) <= target:
                    best, lo = candidate, mid + 1
                else:
                    hi = mid - 1
            if best is not None:
                data = best
        if len(data) > target:
            raise SpecError("target_bytes", f"{target} is smaller than image {image_id} can be "
                            f"encoded ({len(data)} bytes as {style.fmt})")
        return _pad(data, style.fmt, target)
