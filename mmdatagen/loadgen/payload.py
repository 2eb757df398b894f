"""Request bodies exactly as AIPerf builds them (aiperf-compat.md, "What goes on the wire").

Local image files are re-encoded the way AIPerf does (JPEG quality 85 subsampling 0, PNG
compress_level 6) but only once per distinct file (a byte-bounded LRU), so servers see the same
bytes AIPerf would send at a fraction of the cost.
"""
from __future__ import annotations

import base64
import io
import threading
from collections import OrderedDict
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import orjson

from ..errors import DatasetError, UserError
from ..io.imageref import parse_ref, resolve_path
from ..io.readers import Turn

ENDPOINT_TYPES = ("chat", "completions")
ENDPOINT_PATHS = {"chat": "/v1/chat/completions", "completions": "/v1/completions"}


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


class ImageEncoder:
    """Local image files -> data URLs as AIPerf encodes them, cached by resolved path."""

    def __init__(self, dataset_dir: Path | None = None, max_bytes: int = 1 << 30) -> None:
        self.dataset_dir = dataset_dir
        self.max_bytes = max_bytes
        self._cache: OrderedDict[str, str] = OrderedDict()
        self._held = 0
        self.encoded = 0  # files actually encoded (cache misses)
        self._lock = threading.Lock()
        self._pending: dict[str, threading.Event] = {}

    def needs_encoding(self, turn: Turn) -> bool:
        """True when the turn references a local file not yet encoded (encode off the loop)."""
        for ref in turn.images:
            if ref and not ref.startswith("data:") and "://" not in ref:
                if str(resolve_path(ref, self.dataset_dir)) not in self._cache:
                    return True
        return False

    def url(self, ref: str) -> str:
        """The string to put in ``image_url.url`` for a dataset reference."""
        if ref.startswith("data:"):  # sent untouched; check the header without copying MBs
            comma = ref.find(",", 0, 512)
            if comma < 0 or ";base64" not in ref[:comma]:
                raise DatasetError(f"malformed data URL (need data:<mime>;base64,...): {ref[:60]}")
            return ref
        if parse_ref(ref).kind != "path":
            return ref  # http(s) URLs go out untouched; the server fetches
        path = str(resolve_path(ref, self.dataset_dir))
        while True:  # encoding runs in worker threads: one encode per file, others wait for it
            with self._lock:
                hit = self._cache.get(path)
                if hit is not None:
                    self._cache.move_to_end(path)
                    return hit
                pending = self._pending.get(path)
                if pending is None:
                    done = self._pending[path] = threading.Event()
                    break
            pending.wait()  # then re-check: cached now, or encode it here (failed / too big)
        try:
            url = encode_file(Path(path))
            with self._lock:
                self.encoded += 1
                if len(url) <= self.max_bytes:
                    self._cache[path] = url
                    self._held += len(url)
                    while self._held > self.max_bytes:
                        _, old = self._cache.popitem(last=False)
                        self._held -= len(old)
            return url
        finally:
            with self._lock:
                self._pending.pop(path, None)
            done.set()


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
                if img.mode not in ("RGB", "L", "CMYK"):
                    img = img.convert("RGB")
                img.save(buf, format="JPEG", quality=85, subsampling=0)
                mime = "jpeg"
            else:
                img.save(buf, format="PNG", compress_level=6)
                mime = "png"
    except FileNotFoundError:
        raise DatasetError(f"image file not found: {path}") from None
    except (UnidentifiedImageError, OSError) as exc:
        raise DatasetError(f"cannot read image {path}: {exc}") from None
    return f"data:image/{mime};base64,{base64.b64encode(buf.getvalue()).decode('ascii')}"


def user_content(turn: Turn, encoder: ImageEncoder) -> str | list[dict]:
    """A plain string for one text and no media; else texts first, then images (uuid sibling)."""
    images = turn.images
    uuids = turn.image_uuids
    if len(turn.texts) == 1 and not images and not uuids:
        return turn.texts[0]
    parts: list[dict] = [{"type": "text", "text": t} for t in turn.texts]
    if uuids and not images:
        images = [""] * len(uuids)  # cache-only references: empty url with the uuid
    for i, ref in enumerate(images):
        part: dict[str, Any] = {"type": "image_url",
                                "image_url": {"url": encoder.url(ref) if ref else ""}}
        if uuids:
            part["uuid"] = uuids[i]
        parts.append(part)
    return parts


@dataclass
class BodyConfig:
    """What every body shares: model, endpoint, streaming, token field, extra inputs."""

    model: str
    endpoint_type: str = "chat"
    streaming: bool = False
    extra_inputs: dict[str, Any] = field(default_factory=dict)
    legacy_max_tokens: bool = False


def build_body(turn: Turn, cfg: BodyConfig, encoder: ImageEncoder,
               history: list[dict] | None = None) -> dict[str, Any]:
    """The request body dict; ``history`` holds earlier messages of a multi_turn session."""
    if turn.audios or turn.videos:
        raise DatasetError("audio and video rows are not supported by mmdatagen bench")
    # key order as AIPerf 0.13.0 sends it: messages, model, stream, max_completion_tokens,
    # --extra-inputs, the row's extra, and stream_options last (unless extras set it)
    body: dict[str, Any] = {}
    if cfg.endpoint_type == "completions":
        body["prompt"] = " ".join(turn.texts)
    else:
        msg = {"role": turn.role or "user", "content": user_content(turn, encoder)}
        body["messages"] = [*history, msg] if history else [msg]
    body["model"] = cfg.model
    body["stream"] = cfg.streaming
    if turn.output_length is not None:
        body["max_tokens" if cfg.legacy_max_tokens else "max_completion_tokens"] = turn.output_length
    body.update(cfg.extra_inputs)
    if turn.extra:
        body.update(turn.extra)
    if cfg.streaming and "stream_options" not in body:
        body["stream_options"] = {"include_usage": True}
    return body


def serialize(body: dict[str, Any]) -> bytes:
    """orjson bytes (done before the request clock starts)."""
    return orjson.dumps(body)
