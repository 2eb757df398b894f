"""Audio materialisation: deterministic clips per (seed, item id) as WAV (PCM) or MP3.

Each clip is a few tones whose pitches, levels and tremolo are drawn per item, plus a quiet
seeded noise floor, so every item differs in its samples. WAV is written with the standard
library (16-bit PCM); MP3 goes through PyAV's bundled libmp3lame, single-threaded with the
bitexact flags, so a seed fixes every byte.
"""
from __future__ import annotations

import io
import wave
from dataclasses import dataclass

import numpy as np

from .. import rng
from ..errors import SpecError, UserError

FORMATS = ("wav", "mp3")
MIME = {"wav": "audio/wav", "mp3": "audio/mpeg"}
MIN_RATE, MAX_RATE = 8000, 192000
MP3_RATES = (8000, 11025, 12000, 16000, 22050, 24000, 32000, 44100, 48000)
MAX_SECONDS = 3600.0


@dataclass(frozen=True)
class AudioStyle:
    """How pool audio clips are encoded: format, sample rate, channels, duration."""

    fmt: str = "wav"
    sample_rate: int = 16000
    channels: int = 1
    duration: float = 5.0
    mp3_bitrate: int = 64000

    @property
    def num_samples(self) -> int:
        return int(round(self.duration * self.sample_rate))

    @property
    def mime(self) -> str:
        return MIME[self.fmt]

    @property
    def extension(self) -> str:
        return self.fmt

    def validate(self) -> None:
        if self.fmt not in FORMATS:
            raise UserError(f"unsupported audio format {self.fmt!r}; choose from {', '.join(FORMATS)}")
        if not MIN_RATE <= self.sample_rate <= MAX_RATE:
            raise SpecError("audio_sample_rate", f"must be in {MIN_RATE}..{MAX_RATE} Hz, "
                            f"got {self.sample_rate}")
        if self.fmt == "mp3" and self.sample_rate not in MP3_RATES:
            raise UserError(f"mp3 supports sample rates {', '.join(map(str, MP3_RATES))} Hz, "
                            f"got {self.sample_rate}")
        if self.channels not in (1, 2):
            raise SpecError("audio_channels", f"must be 1 or 2, got {self.channels}")
        if not 0 < self.duration <= MAX_SECONDS:
            raise SpecError("audio_duration", f"must be in (0, {MAX_SECONDS:g}] seconds, "
                            f"got {self.duration}")
        if self.num_samples < 1:
            raise SpecError("audio_duration", "is shorter than one sample")


def samples(seed: int, item_id: int, style: AudioStyle) -> np.ndarray:
    """The clip's samples: int16, shape (num_samples, channels)."""
    g = rng.rng_for(seed, rng.AUDIO, item_id)
    n, rate = style.num_samples, style.sample_rate
    t = np.arange(n, dtype=np.float64) / rate
    out = np.empty((n, style.channels), np.int16)
    nyquist = rate / 2
    for ch in range(style.channels):
        mix = np.zeros(n)
        for _ in range(3):
            freq = float(g.uniform(80.0, min(4000.0, nyquist * 0.9)))
            level = float(g.uniform(0.1, 0.25))
            trem = float(g.uniform(0.2, 3.0))
            mix += level * np.sin(2 * np.pi * freq * t + float(g.uniform(0, 2 * np.pi))) \
                * (0.75 + 0.25 * np.sin(2 * np.pi * trem * t))
        mix += g.normal(0.0, 0.01, n)
        out[:, ch] = np.clip(mix * 32767, -32768, 32767).astype(np.int16)
    # the id in the first 32 samples' lowest bit: distinct items even if draws were to collide
    bits = np.array([(item_id >> b) & 1 for b in range(min(32, n))], np.int16)
    out[:len(bits), 0] = (out[:len(bits), 0] & ~1) | bits
    return out


def wav_bytes(pcm: np.ndarray, rate: int) -> bytes:
    """16-bit PCM WAV (RIFF) of int16 samples shaped (n, channels)."""
    buf = io.BytesIO()
    with wave.open(buf, "wb") as w:
        w.setnchannels(pcm.shape[1])
        w.setsampwidth(2)
        w.setframerate(rate)
        w.writeframes(pcm.astype("<i2").tobytes())
    return buf.getvalue()


def mp3_bytes(pcm: np.ndarray, rate: int, bitrate: int) -> bytes:
    """MP3 via PyAV's libmp3lame, bitexact (no encoder tag, no timestamps)."""
    import av

    layout = "mono" if pcm.shape[1] == 1 else "stereo"
    buf = io.BytesIO()
    with av.open(buf, "w", format="mp3", options={"fflags": "+bitexact"}) as out:
        stream = out.add_stream("libmp3lame", rate=rate, layout=layout)
        ctx = stream.codec_context
        ctx.bit_rate = bitrate
        ctx.thread_count = 1
        ctx.options = {"flags": "+bitexact"}
        frame_size = 1152
        for start in range(0, pcm.shape[0], frame_size):
            # packed s16: one row of interleaved samples
            chunk = np.ascontiguousarray(pcm[start:start + frame_size]).reshape(1, -1)
            frame = av.AudioFrame.from_ndarray(chunk, format="s16", layout=layout)
            frame.sample_rate = rate
            frame.pts = start
            for packet in stream.encode(frame):
                out.mux(packet)
        for packet in stream.encode():
            out.mux(packet)
    return buf.getvalue()


class AudioFactory:
    """Renders and encodes pool audio clips; a pure function of (style, seed, id)."""

    def __init__(self, style: AudioStyle, seed: int) -> None:
        style.validate()
        self.style, self.seed = style, seed

    def encode(self, item_id: int) -> bytes:
        pcm = samples(self.seed, item_id, self.style)
        if self.style.fmt == "mp3":
            return mp3_bytes(pcm, self.style.sample_rate, self.style.mp3_bitrate)
        return wav_bytes(pcm, self.style.sample_rate)
