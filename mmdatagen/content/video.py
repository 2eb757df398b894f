"""Video materialisation: deterministic synthetic clips per (seed, item id), encoded by PyAV.

PyAV's wheels bundle FFmpeg (libx264, libvpx-vp9, libx265, libmp3lame), so nothing needs a
system install, and frames go to the encoder in memory (no subprocess, no pipe copies).
Frames are drawn straight in YUV 4:2:0 with numpy (no RGB -> YUV conversion per frame): a
per-item gradient background and moving rectangles that bounce off the edges, so every frame
differs from the last and every item differs from every other (each frame also carries the
item id as a row of black/white squares). Encoding is single-threaded with FFmpeg's bitexact
flags (no library version, creation time or random segment ids in the file), so a seed fixes
every byte for a given FFmpeg build.
"""
from __future__ import annotations

import io
from dataclasses import dataclass
from fractions import Fraction

import numpy as np

from .. import rng
from ..errors import SpecError, UserError

# codec name -> FFmpeg encoder; container -> codecs it may hold
ENCODERS = {"h264": "libx264", "hevc": "libx265", "vp9": "libvpx-vp9", "vp8": "libvpx"}
CONTAINERS = {"mp4": ("h264", "hevc", "vp9"), "webm": ("vp9", "vp8")}
DEFAULT_CODEC = {"mp4": "h264", "webm": "vp9"}
MIME = {"mp4": "video/mp4", "webm": "video/webm"}
CONTENTS = ("shapes", "noise")
MAX_FPS = 240.0
MAX_FRAMES = 100_000
# Fast, deterministic settings per encoder (content is synthetic; speed matters more than size)
_OPTIONS = {
    "libx264": {"preset": "ultrafast", "crf": "23"},
    "libx265": {"preset": "ultrafast", "crf": "28", "x265-params": "log-level=none:pools=none:frame-threads=1"},
    "libvpx-vp9": {"deadline": "realtime", "cpu-used": "8", "row-mt": "0", "crf": "32", "b": "0"},
    "libvpx": {"deadline": "realtime", "cpu-used": "16", "crf": "10", "b": "1M"},
}
_SHAPES = 5
_STAMP_BITS = 32


@dataclass(frozen=True)
class VideoStyle:
    """How pool videos look and are encoded: container, codec, frame count, frame rate."""

    container: str = "mp4"
    codec: str | None = None  # None: the container's default (mp4: h264, webm: vp9)
    fps: float = 2.0
    frames: int | None = 16
    duration: float | None = None  # seconds; sets frames = round(duration * fps) when given
    content: str = "shapes"

    @property
    def codec_name(self) -> str:
        return self.codec or DEFAULT_CODEC.get(self.container, "h264")

    @property
    def num_frames(self) -> int:
        if self.duration is not None:
            return int(round(self.duration * self.fps))
        return int(self.frames or 0)

    @property
    def seconds(self) -> float:
        """Clip duration in seconds (frames / fps)."""
        return self.num_frames / self.fps

    @property
    def rate(self) -> Fraction:
        return Fraction(self.fps).limit_denominator(1001)

    @property
    def mime(self) -> str:
        return MIME[self.container]

    @property
    def extension(self) -> str:
        return self.container

    def validate(self) -> None:
        self._validate_encoding()
        self._validate_timing()

    def _validate_encoding(self) -> None:
        if self.container not in CONTAINERS:
            raise SpecError("video_format", f"must be one of {', '.join(CONTAINERS)}, got "
                            f"{self.container!r}")
        codec = self.codec_name
        if codec not in ENCODERS:
            raise SpecError("video_codec", f"must be one of {', '.join(ENCODERS)}, got {codec!r}")
        if codec not in CONTAINERS[self.container]:
            raise UserError(f"a {self.container} container cannot hold {codec}; use "
                            f"{' or '.join(CONTAINERS[self.container])}")
        if self.content not in CONTENTS:
            raise SpecError("video_content", f"must be one of {', '.join(CONTENTS)}, got "
                            f"{self.content!r}")
        if ENCODERS[codec] not in _available_encoders():
            raise UserError(f"this FFmpeg build has no {ENCODERS[codec]} encoder for {codec}")

    def _validate_timing(self) -> None:
        if not (self.fps > 0) or self.fps > MAX_FPS:
            raise SpecError("video_fps", f"must be in (0, {MAX_FPS:g}], got {self.fps}")
        if self.duration is not None and not (self.duration > 0):
            raise SpecError("video_duration", f"must be positive, got {self.duration}")
        frames = self.num_frames
        if frames < 1 and self.duration is not None:
            raise SpecError("video_duration", f"is too short: {self.duration:g} s at "
                            f"{self.fps:g} fps makes {frames} frames (a video needs one)")
        if frames < 1:
            raise SpecError("video_frames", f"must be at least 1, got {frames}")
        if frames > MAX_FRAMES:
            raise UserError(f"{frames} frames per video is more than {MAX_FRAMES}")
        self._validate_servable(frames)

    def _validate_servable(self, frames: int) -> None:
        """A clip every video model the engines serve can take: vLLM's Qwen2/2.5-VL and Qwen3-VL
        loaders and processors (``media_tokens``) refuse, e.g., a one-frame video, so the
        generator refuses to write a dataset no run could use."""
        from ..media_tokens import QWEN3_VL, QWEN25_VL, video_cost

        for geom in (QWEN3_VL, QWEN25_VL):
            try:
                video_cost(geom, frames, self.fps, 640, 360)
            except ValueError as exc:
                field = "video_duration" if self.duration is not None else "video_frames"
                raise SpecError(field, f"makes {frames}-frame videos, which vLLM refuses "
                                       f"({exc})") from None


def _available_encoders() -> frozenset[str]:
    import av

    return frozenset(av.codecs_available)


class _Scene:
    """A clip's fixed parts: background planes, shapes (colour, size, start, velocity)."""

    def __init__(self, seed: int, item_id: int, width: int, height: int) -> None:
        g = rng.rng_for(seed, rng.VIDEO, item_id)
        self.w, self.h = width, height
        cw, ch = width // 2, height // 2
        y0, y1 = (int(v) for v in g.integers(16, 236, 2))
        ramp = np.linspace(y0, y1, height, dtype=np.float32)[:, None]
        tilt = np.linspace(0, float(g.integers(-40, 41)), width, dtype=np.float32)[None, :]
        self.y = np.clip(ramp + tilt, 16, 235).astype(np.uint8)
        u0, v0 = (int(v) for v in g.integers(64, 192, 2))
        du, dv = (float(v) for v in g.integers(-48, 49, 2))
        self.u = np.clip(u0 + np.linspace(0, du, ch, dtype=np.float32)[:, None]
                         + np.zeros((1, cw), np.float32), 16, 240).astype(np.uint8)
        self.v = np.clip(v0 + np.linspace(0, dv, cw, dtype=np.float32)[None, :]
                         + np.zeros((ch, 1), np.float32), 16, 240).astype(np.uint8)
        self.shapes = []
        for _ in range(_SHAPES):
            sw = int(g.integers(max(2, width // 16), max(3, width // 4))) & ~1
            sh = int(g.integers(max(2, height // 16), max(3, height // 3))) & ~1
            colour = tuple(int(c) for c in g.integers(16, 240, 3))
            start = (float(g.uniform(0, width - sw)), float(g.uniform(0, height - sh)))
            speed = (float(g.uniform(-0.08, 0.08)) * width, float(g.uniform(-0.08, 0.08)) * height)
            self.shapes.append((max(2, sw), max(2, sh), colour, start, speed))
        self.cell = max(2, min(16, width // _STAMP_BITS) & ~1)
        self.stamp = [(item_id >> b) & 1 for b in range(_STAMP_BITS)]

    @staticmethod
    def _bounce(pos: float, span: int) -> int:
        """Position moving with constant speed between 0 and ``span``, reflected at the ends."""
        if span <= 0:
            return 0
        p = pos % (2 * span)
        return int(p if p <= span else 2 * span - p) & ~1

    def frame(self, index: int) -> np.ndarray:
        """Frame ``index`` as one (H*3/2, W) uint8 array: Y plane, then U, then V (4:2:0)."""
        w, h = self.w, self.h
        flat = np.empty(w * h * 3 // 2, np.uint8)
        y = flat[:w * h].reshape(h, w)
        u = flat[w * h:w * h * 5 // 4].reshape(h // 2, w // 2)
        v = flat[w * h * 5 // 4:].reshape(h // 2, w // 2)
        y[:], u[:], v[:] = self.y, self.u, self.v
        for sw, sh, (cy, cu, cv), (x0, y0), (vx, vy) in self.shapes:
            x = self._bounce(x0 + vx * index, w - sw)
            t = self._bounce(y0 + vy * index, h - sh)
            y[t:t + sh, x:x + sw] = cy
            u[t // 2:(t + sh) // 2, x // 2:(x + sw) // 2] = cu
            v[t // 2:(t + sh) // 2, x // 2:(x + sw) // 2] = cv
        c = self.cell
        for bit, on in enumerate(self.stamp):
            if (bit + 1) * c <= w and c <= h:
                y[:c, bit * c:(bit + 1) * c] = 235 if on else 16
        return flat.reshape(-1, w)


def noise_frame(seed: int, item_id: int, index: int, width: int, height: int) -> np.ndarray:
    """Uniform noise in all three planes (the incompressible worst case), (H*3/2, W) uint8."""
    n = width * height * 3 // 2
    raw = np.random.PCG64(np.random.SeedSequence([seed, rng.VIDEO, item_id, index])).random_raw(n // 8 + 1)
    return raw.view(np.uint8)[:n].reshape(-1, width)


class VideoFactory:
    """Renders and encodes pool videos; a pure function of (style, seed, id, size)."""

    def __init__(self, style: VideoStyle, seed: int) -> None:
        style.validate()
        self.style, self.seed = style, seed

    def frames(self, item_id: int, width: int, height: int):
        """The clip's frames, each a (H*3/2, W) yuv420p array."""
        n = self.style.num_frames
        if self.style.content == "noise":
            for i in range(n):
                yield noise_frame(self.seed, item_id, i, width, height)
            return
        scene = _Scene(self.seed, item_id, width, height)
        for i in range(n):
            yield scene.frame(i)

    def encode(self, item_id: int, width: int, height: int) -> bytes:
        """The encoded clip (container bytes)."""
        return encode_frames(self.frames(item_id, width, height), width, height, self.style)


def encode_frames(frames, width: int, height: int, style: VideoStyle) -> bytes:
    """Encode yuv420p frames into the style's container, single-threaded and bitexact."""
    import av
    from av.video.stream import VideoStream

    encoder = ENCODERS[style.codec_name]
    buf = io.BytesIO()
    with av.open(buf, "w", format=style.container,
                 options={"fflags": "+bitexact"}) as out:
        stream = out.add_stream(encoder, rate=style.rate)
        if not isinstance(stream, VideoStream):
            raise TypeError(f"{encoder} is not a video encoder")
        stream.width, stream.height, stream.pix_fmt = width, height, "yuv420p"
        ctx = stream.codec_context
        ctx.thread_count = 1
        ctx.thread_type = "SLICE"
        ctx.options = {**_OPTIONS[encoder], "flags": "+bitexact"}
        for array in frames:
            frame = av.VideoFrame.from_ndarray(array, format="yuv420p")
            for packet in stream.encode(frame):
                out.mux(packet)
        for packet in stream.encode():
            out.mux(packet)
    return buf.getvalue()
