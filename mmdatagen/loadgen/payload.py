"""Request bodies exactly as AIPerf builds them (aiperf-compat.md, "What goes on the wire").

Local image files are re-encoded the way AIPerf does (JPEG quality 85 subsampling 0, PNG
compress_level 6) but only once per distinct file (a byte-bounded LRU), so servers see the same
bytes AIPerf would send at a fraction of the cost. Local video files (.mp4/.webm) become
``data:video/<ext>;base64,...`` of their bytes and local audio files (.wav/.mp3) AIPerf's
``<fmt>,<base64>`` form, also once per file; parts go out as AIPerf 0.13.0 sends them: texts,
images, ``input_audio`` ({"data", "format"}), then ``video_url``.
"""
from __future__ import annotations

import base64
import threading
from collections import OrderedDict
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import orjson

from ..errors import DatasetError
from ..io.encode import encode_file
from ..io.imageref import INLINE_AUDIO, local_files
from ..io.readers import Turn
from ..settings.values import coerce_value, parse_extra_inputs, parse_headers  # noqa: F401

ENDPOINT_TYPES = ("chat", "completions")
ENDPOINT_PATHS = {"chat": "/v1/chat/completions", "completions": "/v1/completions"}


#: a turn's local files, resolved before its body is built (``io.imageref.local_files``)
Files = Mapping[str, "str | Exception"]


class ImageEncoder:
    """Local image files -> data URLs as AIPerf encodes them, cached by resolved path.

    The loader resolves a turn's references first (``io.imageref.local_files``) and hands the
    resolved paths to :meth:`image_url`, :meth:`audio` and :meth:`video_url`; :meth:`url`
    resolves one reference on its own."""

    def __init__(self, dataset_dir: Path | None = None, max_bytes: int = 1 << 30) -> None:
        self.dataset_dir = dataset_dir
        self.max_bytes = max_bytes
        self._cache: OrderedDict[str, str] = OrderedDict()
        self._held = 0
        self.encoded = 0  # files actually encoded (cache misses)
        self._lock = threading.Lock()
        self._pending: dict[str, threading.Event] = {}

    def needs_encoding(self, files: Files) -> bool:
        """True when a resolved file of a turn is not yet encoded (encode off the loop)."""
        if not files:  # text, data URLs and http(s) URLs only
            return False
        return any(isinstance(p, str) and p not in self._cache for p in files.values())

    def url(self, ref: str) -> str:
        """:meth:`image_url` of one reference, resolved on its own."""
        return self.image_url(ref, local_files(Turn(images=[ref]), self.dataset_dir))

    def image_url(self, ref: str, files: Files) -> str:
        """The string to put in ``image_url.url`` for a dataset reference."""
        if ref.startswith("data:"):  # sent untouched; check the header without copying MBs
            return _checked_data_url(ref)
        # encoding runs in worker threads: one encode per file, others wait for it
        return self._local(ref, files, encode_file)

    def video_url(self, ref: str, files: Files) -> str:
        """The string to put in ``video_url.url``: data and http(s) URLs untouched, local files
        as a data URL of their bytes (AIPerf accepts .mp4 and .webm)."""
        if ref.startswith("data:"):
            return _checked_data_url(ref)
        return self._local(ref, files, encode_video_file)

    def audio(self, ref: str, files: Files) -> dict[str, str]:
        """The ``input_audio`` object: ``<fmt>,<base64>`` and ``data:audio/<fmt>;base64,`` split
        into format and data, local .wav/.mp3 files read once."""
        if not _inline_audio(ref) and not ref.startswith("data:"):
            if "://" in ref:
                raise DatasetError(f"audio must be inline or a local file, not a URL: {ref[:60]}")
            ref = self._local(ref, files, encode_audio_file)
        if ref.startswith("data:audio/"):
            head, _, data = ref.partition(",")
            return {"data": data, "format": head[len("data:audio/"):].split(";", 1)[0] or "wav"}
        fmt, _, data = ref.partition(",")
        return {"data": data, "format": fmt}

    def _local(self, ref: str, files: Files, encode) -> str:
        """A resolved local file encoded (once); a reference with no file goes out as it is
        (an http(s) URL: the server fetches); one refused when it was resolved raises."""
        path = files.get(ref)
        if path is None:
            return ref
        if isinstance(path, Exception):
            raise path
        return self._cached(path, encode)

    def _cached(self, path: str, encode) -> str:
        """``encode(Path(path))`` once per path (an LRU bounded by bytes; racing threads wait)."""
        while True:
            with self._lock:
                hit = self._cache.get(path)
                if hit is not None:
                    self._cache.move_to_end(path)
                    return hit
                pending = self._pending.get(path)
                if pending is None:
                    done = self._pending[path] = threading.Event()
                    break
            pending.wait()
        try:
            url = encode(Path(path))
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


def _checked_data_url(ref: str) -> str:
    """A data URL sent untouched, its header checked without copying megabytes."""
    comma = ref.find(",", 0, 512)
    if comma < 0 or ";base64" not in ref[:comma]:
        raise DatasetError(f"malformed data URL (need data:<mime>;base64,...): {ref[:60]}")
    return ref


def _inline_audio(ref: str) -> bool:
    """AIPerf's inline audio form ``wav,<base64>`` / ``mp3,<base64>``."""
    return ref[:4].lower() in INLINE_AUDIO


def _read_media(path: Path, what: str) -> bytes:
    try:
        return path.read_bytes()
    except FileNotFoundError:
        raise DatasetError(f"{what} file not found: {path}") from None
    except OSError as exc:
        raise DatasetError(f"cannot read {what} {path}: {exc.strerror}") from None


def encode_video_file(path: Path) -> str:
    """A local video as AIPerf sends it: ``data:video/<mp4|webm>;base64,`` of the file bytes."""
    ext = path.suffix.lower().lstrip(".")
    if ext not in ("mp4", "webm"):
        raise DatasetError(f"{path}: only .mp4 and .webm video files are accepted")
    return f"data:video/{ext};base64,{base64.b64encode(_read_media(path, 'video')).decode('ascii')}"


def encode_audio_file(path: Path) -> str:
    """A local audio file as AIPerf reads it: ``<wav|mp3>,<base64>`` of the file bytes."""
    ext = path.suffix.lower().lstrip(".")
    if ext not in ("wav", "mp3"):
        raise DatasetError(f"{path}: only .wav and .mp3 audio files are accepted")
    return f"{ext},{base64.b64encode(_read_media(path, 'audio')).decode('ascii')}"




def user_content(turn: Turn, encoder: ImageEncoder) -> str | list[dict]:
    """:func:`resolved_content` of a turn whose local files are resolved here."""
    return resolved_content(turn, local_files(turn, encoder.dataset_dir), encoder)


def resolved_content(turn: Turn, files: Files, encoder: ImageEncoder) -> str | list[dict]:
    """A plain string for one text and no media; else texts first, then images (uuid sibling),
    audios, videos (AIPerf's order). ``files``: the turn's resolved local files."""
    images = turn.images
    uuids = turn.image_uuids
    if len(turn.texts) == 1 and not images and not uuids and not turn.audios and not turn.videos:
        return turn.texts[0]
    parts: list[dict] = [{"type": "text", "text": t} for t in turn.texts]
    if uuids and not images:
        images = [""] * len(uuids)  # cache-only references: empty url with the uuid
    for i, ref in enumerate(images):
        part: dict[str, Any] = {"type": "image_url",
                                "image_url": {"url": encoder.image_url(ref, files) if ref else ""}}
        if uuids:
            part["uuid"] = uuids[i]
        parts.append(part)
    for ref in turn.audios:  # AIPerf skips empty contents
        if ref:
            parts.append({"type": "input_audio", "input_audio": encoder.audio(ref, files)})
    for ref in turn.videos:
        if ref:
            parts.append({"type": "video_url", "video_url": {"url": encoder.video_url(ref, files)}})
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
    """:func:`resolved_body` of a turn whose local files are resolved here."""
    return resolved_body(turn, local_files(turn, encoder.dataset_dir), cfg, encoder, history)


def resolved_body(turn: Turn, files: Files, cfg: BodyConfig, encoder: ImageEncoder,
                  history: list[dict] | None = None) -> dict[str, Any]:
    """The request body dict of a turn whose local files are resolved (``files``:
    ``io.imageref.local_files``); ``history`` holds earlier messages of a multi_turn session."""
    # key order as AIPerf 0.13.0 sends it: messages, model, stream, max_completion_tokens,
    # --extra-inputs, the row's extra, and stream_options last (unless extras set it)
    body: dict[str, Any] = {}
    if cfg.endpoint_type == "completions":
        body["prompt"] = " ".join(turn.texts)
    else:
        msg = {"role": turn.role or "user", "content": resolved_content(turn, files, encoder)}
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
