"""Video and audio references: decode the inline forms and read stream headers (no pixels).

The counterpart of ``imageref`` for the other modalities: what a server needs to size a clip
(frames, frame rate, width, height; samples, sample rate, channels) without decoding frames.
"""
from __future__ import annotations

import base64
import binascii
import io
import wave
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar

import blake3

from ..caches.entries import clip_entry_size
from ..caches.targets import CacheTarget
from ..errors import DatasetError
from ..media_tokens import QWEN2_AUDIO, audio_cost, model_video_geometry, video_cost
from ..vlm import VisionModel


@dataclass(frozen=True)
class VideoInfo:
    frames: int
    fps: float
    width: int
    height: int


REMOTE_VIDEO = (16, 2.0, 640, 360)  # frames, fps, width, height assumed for http(s) videos
_REMOTE_INFO = VideoInfo(*REMOTE_VIDEO)


@dataclass(frozen=True)
class AudioInfo:
    samples: int
    sample_rate: int
    channels: int


def decode_b64(data: str, what: str) -> bytes:
    try:
        return base64.b64decode(data, validate=True)
    except (binascii.Error, ValueError):
        raise DatasetError(f"{what} is not valid base64") from None


def decode_video_url(url: str) -> bytes:
    """The bytes of a ``data:video/...;base64,`` URL."""
    head, sep, data = url.partition(",")
    if not sep or ";base64" not in head or not head.startswith("data:video/"):
        raise DatasetError(f"not a base64 video data URL: {url[:40]!r}")
    return decode_b64(data, "video data URL")


def video_info(data: bytes) -> VideoInfo:
    """Frames, frame rate and size from the container (packets counted when not recorded)."""
    import av

    try:
        with av.open(io.BytesIO(data), "r") as inp:
            if not inp.streams.video:
                raise DatasetError("the video has no video stream")
            stream = inp.streams.video[0]
            rate = float(stream.average_rate or stream.guessed_rate or 0)
            frames = stream.frames
            if not frames:
                frames = sum(1 for p in inp.demux(stream) if p.size)
            return VideoInfo(int(frames), rate, stream.codec_context.width,
                             stream.codec_context.height)
    except DatasetError:
        raise
    except Exception as exc:
        raise DatasetError(f"cannot read the video: {type(exc).__name__}") from None


AUDIO_FORMATS = ("wav", "mp3")  # input_audio formats (OpenAI's; what audio_info reads)


def audio_info(data: bytes, fmt: str) -> AudioInfo:
    """Samples, rate and channels of a WAV (header) or MP3 (decoded frame counts) clip."""
    if fmt == "wav":
        try:
            with wave.open(io.BytesIO(data)) as w:
                return AudioInfo(w.getnframes(), w.getframerate(), w.getnchannels())
        except (wave.Error, EOFError) as exc:
            raise DatasetError(f"cannot read the wav audio: {exc}") from None
    if fmt != "mp3":
        raise DatasetError(f"unsupported audio format {fmt!r} (wav or mp3)")
    import av

    try:
        with av.open(io.BytesIO(data), "r") as inp:
            stream = inp.streams.audio[0]
            samples = sum(f.samples for f in inp.decode(stream))
            return AudioInfo(samples, stream.sample_rate, stream.channels)
    except Exception as exc:
        raise DatasetError(f"cannot read the mp3 audio: {type(exc).__name__}") from None


MediaKey = tuple[str, str]  # ("video" | "audio", blake3) by content, ("ref", url), ("uuid", id)
Sized = tuple[int, int, int]  # encoder tokens, prompt tokens, entry size in the target's unit
R = TypeVar("R")
#: ``make(key, tokens, prompt tokens, entry size, remote)``: what the caller builds per part.
Make = Callable[[MediaKey, int, int, int, bool], R]


class MediaResolver:
    """``video_url`` / ``input_audio`` parts -> ``make(key, tokens, prompt tokens, entry size,
    remote)``, sized for one model and cache target (the simulator's SimImage; the loader's
    prediction can use the same), memoised by content hash and by reference string. Bad input
    raises ``error(400, message)``."""

    def __init__(self, model: VisionModel, target: CacheTarget,
                 error: Callable[[int, str], Exception], memo_size: int = 4096,
                 dataset_dir: Path | None = None) -> None:
        self.model, self.target, self.error = model, target, error
        self.dataset_dir = dataset_dir  # local files allowed (virtual runs) when set
        self.geom = model_video_geometry(model)  # None: no patch geometry or no video rule
        self._memo: dict[MediaKey, Sized] = {}
        self._strings: dict[bytes, tuple[MediaKey, Sized]] = {}  # by reference hash
        self._memo_size = memo_size

    def _size(self, tokens: int, prompt: int, processor: int) -> Sized:
        return tokens, prompt, clip_entry_size(self.target, self.model, tokens, processor)

    def _key(self, content_key: MediaKey, ref: str, uuid: str | None) -> MediaKey:
        mode = self.target.key
        if mode == "uuid" and uuid:
            return ("uuid", uuid)
        if mode == "reference" and ref:
            return ("ref", ref)
        return content_key

    def video(self, part: Mapping[str, Any], make: Make[R]) -> R:
        url, uuid = self._video_ref(part)
        remote = url.startswith(("http://", "https://"))
        seen = self._strings.get(_digest(url))
        if seen is not None:  # the same reference string again: no base64 decoding, no hashing
            return make(self._key(seen[0], url, uuid), *seen[1], remote)
        key, source = self._video_source(url, remote)
        sized = self._memo.get(key)
        if sized is None:
            info = source if isinstance(source, VideoInfo) else self._video_info(source)
            sized = self._video_size(info)
            self._remember(key, sized)
        if not remote and "://" not in url and not url.startswith("data:"):
            return make(self._key(key, url, uuid), *sized, remote)  # files may change
        self._remember_string(url, key, sized)
        return make(self._key(key, url, uuid), *sized, remote)

    def _video_ref(self, part: Mapping[str, Any]) -> tuple[str, str | None]:
        """The part's URL and uuid, checked (and that the model can take videos at all)."""
        vu = part.get("video_url")
        if not isinstance(vu, dict):  # as image_url: vLLM's schema takes an object only
            raise self.error(400, "'video_url' must be an object {\"url\": ...}")
        url = vu.get("url")
        uuid = part.get("uuid")
        if not isinstance(url, str) or not url or (uuid is not None and not isinstance(uuid, str)):
            raise self.error(400, "video_url parts need a non-empty string 'url'")
        if self.geom is None:
            raise self.error(400, f"model {self.model.name} has no video geometry")
        return url, uuid

    def _video_source(self, url: str, remote: bool) -> tuple[MediaKey, VideoInfo | bytes]:
        """The video's content key and its bytes (an http(s) URL: its reference and the size
        assumed for remote videos)."""
        if remote:
            return ("ref", url), _REMOTE_INFO
        local = self.dataset_dir is not None and "://" not in url
        if not (url.startswith("data:video/") or local):
            raise self.error(400, "video_url.url must be a data:video/ URL or an http(s) URL")
        try:
            if url.startswith("data:") or self.dataset_dir is None:
                data = decode_video_url(url)
            else:
                data = read_local(url, self.dataset_dir)
        except DatasetError as exc:
            raise self.error(400, f"invalid video: {exc}") from None
        return ("video", blake3.blake3(data).hexdigest()), data

    def _video_info(self, data: bytes) -> VideoInfo:
        try:
            return video_info(data)
        except DatasetError as exc:
            raise self.error(400, f"invalid video: {exc}") from None

    def _video_size(self, info: VideoInfo) -> Sized:
        if self.geom is None:
            raise self.error(400, f"model {self.model.name} has no video geometry")
        try:
            cost = video_cost(self.geom, info.frames, info.fps, info.width, info.height)
        except ValueError as exc:
            raise self.error(400, f"video rejected: {exc}") from None
        return self._size(cost.tokens, cost.prompt_tokens, cost.processor_bytes)

    def audio(self, part: Mapping[str, Any], make: Make[R]) -> R:
        ia = part.get("input_audio")
        if not isinstance(ia, dict) or not isinstance(ia.get("data"), str) \
                or not isinstance(ia.get("format"), str):
            raise self.error(400, "input_audio parts need string 'data' and 'format'")
        fmt, text = ia["format"].lower(), ia["data"]
        if fmt not in AUDIO_FORMATS:  # checked first: a clip seen before must not skip it
            raise self.error(400, f"invalid audio: unsupported audio format {fmt[:20]!r} "
                                  f"({' or '.join(AUDIO_FORMATS)})")
        uuid = part.get("uuid")
        seen = self._strings.get(_digest(fmt + "," + text))
        if seen is not None:
            return make(self._key(seen[0], "", uuid), *seen[1], False)
        try:
            data = decode_b64(text, "input_audio.data")
            key: MediaKey = ("audio", blake3.blake3(data).hexdigest())
            sized = self._memo.get(key)
            if sized is None:
                sized = self._audio_size(audio_info(data, fmt))
                self._remember(key, sized)
        except DatasetError as exc:
            raise self.error(400, f"invalid audio: {exc}") from None
        self._remember_string(fmt + "," + text, key, sized)
        return make(self._key(key, "", uuid), *sized, False)

    def _audio_size(self, a: AudioInfo) -> Sized:
        cost = audio_cost(QWEN2_AUDIO, a.samples, a.sample_rate)
        return self._size(cost.tokens, cost.prompt_tokens, cost.processor_bytes)

    def _remember(self, key: MediaKey, sized: Sized) -> None:
        if len(self._memo) >= self._memo_size:
            self._memo.clear()
        self._memo[key] = sized

    def _remember_string(self, text: str, key: MediaKey, sized: Sized) -> None:
        if len(self._strings) >= self._memo_size:
            self._strings.clear()
        self._strings[_digest(text)] = (key, sized)


def _digest(text: str) -> bytes:
    return blake3.blake3(text.encode()).digest()


def read_local(ref: str, folder: Path) -> bytes:
    path = Path(ref) if Path(ref).is_absolute() else folder / ref
    try:
        return path.read_bytes()
    except OSError as exc:
        raise DatasetError(f"cannot read {path}: {exc.strerror}") from None
