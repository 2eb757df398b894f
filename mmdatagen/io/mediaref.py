"""Video and audio references: decode the inline forms and read stream headers (no pixels).

The counterpart of ``imageref`` for the other modalities: what a server needs to size a clip
(frames, frame rate, width, height; samples, sample rate, channels) without decoding frames.
"""
from __future__ import annotations

import base64
import binascii
import io
import wave
from dataclasses import dataclass

from ..errors import DatasetError


@dataclass(frozen=True)
class VideoInfo:
    frames: int
    fps: float
    width: int
    height: int


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
        with av.open(io.BytesIO(data)) as inp:
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
    except Exception as exc:  # noqa: BLE001 - av raises many types on bad input
        raise DatasetError(f"cannot read the video: {type(exc).__name__}") from None


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
        with av.open(io.BytesIO(data)) as inp:
            stream = inp.streams.audio[0]
            samples = sum(f.samples for f in inp.decode(stream))
            return AudioInfo(samples, stream.sample_rate, stream.channels)
    except Exception as exc:  # noqa: BLE001
        raise DatasetError(f"cannot read the mp3 audio: {type(exc).__name__}") from None
