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
from .readers import Turn

KEY_MODES = ("bytes", "pixels", "reference", "uuid")
DEFAULT_URL_SIZE = (640, 480)  # an http(s) image the server fetches is sized as this when unknown


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


INLINE_AUDIO = ("wav,", "mp3,")  # AIPerf's inline audio form: ``wav,<base64>`` / ``mp3,<base64>``


def local_files(turn: Turn, dataset_dir: Path | None) -> dict[str, str | Exception]:
    """Every local file a turn's media references name, resolved once (:func:`resolve_path`)
    before its body is built: reference -> path text. Images and videos are classified as
    :func:`parse_ref` does; a refused ``file://`` reference maps to its error, raised where the
    body meets it (so does a name too long for a path that looks like inline audio; any other
    such name fails here, first). An audio reference in AIPerf's inline form is no file. Data
    URLs and http(s) URLs have no entry: they go out as they are."""
    files: dict[str, str | Exception] = {}
    for ref in (*turn.images, *turn.videos):
        if ref and not ref.startswith("data:") and ref not in files:
            try:
                if parse_ref(ref).kind == "path":
                    files[ref] = str(resolve_path(ref, dataset_dir))
            except DatasetError as exc:
                files[ref] = exc
            except OSError as exc:
                if ref[:4].lower() not in INLINE_AUDIO:
                    raise
                files[ref] = exc
    for ref in turn.audios:
        if (ref and not ref.startswith("data:") and ref[:4].lower() not in INLINE_AUDIO
                and "://" not in ref and ref not in files):
            files[ref] = str(resolve_path(ref, dataset_dir))
    return files


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


# -- one identity and sizing service for analysis, simulator and the loader's prediction -------

@dataclass(frozen=True)
class Identity:
    """An image as a cache sees it: ``key`` (equal keys <=> one cache entry under the key mode)
    and its dimensions (0 x 0 when unknown: an http URL the server fetches, or a uuid alone)."""

    key: tuple
    width: int
    height: int
    remote: bool = False


_B64 = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/"
PNG_MAGIC = b"\x89PNG\r\n\x1a\n"


def canonical_b64(raw: bytes) -> bool:
    """Is ``raw`` the one base64 text of its bytes (alphabet, padding, zero trailing bits)?"""
    rest = raw.translate(None, _B64)
    if len(raw) % 4 or rest not in (b"", b"=", b"==") or not raw.endswith(rest):
        return False
    if rest:
        last = _B64.find(raw[-len(rest) - 1:-len(rest)])
        if last < 0 or last & (0b1111 if len(rest) == 2 else 0b11):
            return False
    return len(raw) > 0


class ImageIdentifier:
    """Identifies image references under one key mode, memoising by reference string.

    Key modes (``KEY_MODES``): ``bytes`` the encoded bytes (vLLM's content hash), ``pixels`` the
    decoded RGB pixels (Dynamo aggregated), ``reference`` the reference string itself (Dynamo
    disaggregated), ``uuid`` a client uuid when one is given, else the encoded bytes (vLLM).
    A uuid with no reference is always keyed by the uuid (nothing else identifies it).
    Local files: AIPerf re-encodes them deterministically, so equal files give equal requests.
    """

    def __init__(self, mode: str, dataset_dir: Path | None = None, memo_size: int = 1 << 20):
        if mode not in KEY_MODES:
            raise DatasetError(f"unknown key mode {mode!r}; choose from {', '.join(KEY_MODES)}")
        self.mode, self.dir, self.memo_size = mode, dataset_dir, memo_size
        self._memo: dict = {}
        self._uuid_dims: dict[str, tuple[int, int]] = {}  # a uuid's first known dimensions
        self.saw_uuids = False

    def __call__(self, ref: str, uuid: str | None = None) -> Identity:
        self.saw_uuids = self.saw_uuids or bool(uuid)
        if not ref:
            if not uuid:
                raise DatasetError("an image reference without a uuid is empty")
            w, h = self._uuid_dims.get(uuid, (0, 0))
            return Identity(("uuid", uuid), w, h)
        ident = self._lookup(ref)
        if uuid and ident.width > 0 and uuid not in self._uuid_dims:
            if len(self._uuid_dims) >= self.memo_size:
                self._uuid_dims.clear()
            self._uuid_dims[uuid] = (ident.width, ident.height)
        if self.mode == "uuid" and uuid:
            w, h = self._uuid_dims.get(uuid, (ident.width, ident.height))
            return Identity(("uuid", uuid), w, h, ident.remote)
        return ident

    def _remember(self, memo, ident: Identity) -> Identity:
        if len(self._memo) >= self.memo_size:
            self._memo.clear()
        self._memo[memo] = ident
        return ident

    def _lookup(self, ref: str) -> Identity:
        if ref.startswith("data:") and self.mode != "pixels":
            return self._data_url(ref)
        memo = ref if len(ref) <= 256 else blake3.blake3(ref.encode()).digest()  # flat memory
        hit = self._memo.get(memo)
        return hit if hit is not None else self._remember(memo, self._resolve(ref))

    def _resolve(self, ref: str) -> Identity:
        parsed = parse_ref(ref)
        if parsed.kind == "url":
            return Identity(("url", ref), 0, 0, True)  # the server fetches it
        data = load_bytes(ref, self.dir) or b""
        w, h = image_dims(data)
        if self.mode == "pixels":
            # only a lossless re-encoding (data URLs as sent, PNG files) keeps the pixels
            lossless = parsed.kind == "data" or data[:8] == PNG_MAGIC
            return Identity(("px" if lossless else "file-px", pixel_key(data)), w, h)
        # a local file reaches the server as the data URL AIPerf encodes it from the file: a
        # function of the content, so in every mode equal files are one entry
        return Identity(("file", bytes_key(data)), w, h)

    def _data_url(self, ref: str) -> Identity:
        """Base64 data URLs: key on the canonical base64 text (equal bytes <=> equal canonical
        base64) and decode only the header for the dimensions."""
        head, _, payload = ref.partition(",")
        raw = payload.encode("ascii", "replace")
        digest = blake3.blake3(raw).digest()
        memo = (head, digest)
        hit = self._memo.get(memo)
        if hit is not None:
            return hit
        parse_ref(head + ",")  # data URLs must be base64: one-line error otherwise
        canonical = digest
        if canonical_b64(raw):
            dims = data_url_dims(raw)
        else:  # non-canonical (stray bits) or malformed: decode, validate, re-encode canonically
            data = decode_data_url(ref)
            dims = image_dims(data)
            canonical = blake3.blake3(base64.b64encode(data)).digest()
        # reference mode keys the URL string itself (head and payload as written)
        key = ("ref", head, digest) if self.mode == "reference" else ("data", canonical)
        return self._remember(memo, Identity(key, dims[0], dims[1]))
