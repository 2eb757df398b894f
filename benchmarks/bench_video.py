"""Video generation speed per core and memory flatness, against a naive encoder in the same run.

    python benchmarks/bench_video.py            # 1280x720, 16 frames: per-core clips/s, ratio, memory
    python benchmarks/bench_video.py --quick    # fewer clips, no memory runs

Ours: frames drawn straight in YUV 4:2:0 with numpy, PyAV (bundled FFmpeg) libx264 ultrafast
or libvpx-vp9 realtime, one thread, bitexact. The naive reference does what a first attempt
does: each frame drawn in RGB with PIL, handed to PyAV as rgb24 (swscale converts every frame),
libx264 with its default preset and threading. Where imageio-ffmpeg is installed, the same
frames are also piped to its bundled ffmpeg binary (the library-choice comparison).
Memory: peak RSS of ``mmdatagen pool`` writing 4x more distinct 720p clips (path and data-url
delivery) should stay flat.
"""
from __future__ import annotations

import argparse
import io
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
from PIL import Image, ImageDraw

from mmdatagen.content.video import VideoFactory, VideoStyle

W, H, FRAMES, FPS = 1280, 720, 16, 2


def ours(style: VideoStyle, clips: int) -> tuple[float, int]:
    factory = VideoFactory(style, seed=0)
    start = time.perf_counter()
    size = sum(len(factory.encode(i, W, H)) for i in range(clips))
    return (time.perf_counter() - start) / clips, size // clips


def naive_frames(item: int) -> list[np.ndarray]:
    g = np.random.default_rng(item)
    base = np.linspace(g.integers(0, 255, 3), g.integers(0, 255, 3), H).astype(np.uint8)
    frames = []
    for f in range(FRAMES):
        img = Image.fromarray(np.repeat(base[:, None, :], W, axis=1))
        draw = ImageDraw.Draw(img)
        for s in range(5):
            x, y = (40 * s + 25 * f) % (W - 200), (60 * s + 15 * f) % (H - 150)
            draw.rectangle([x, y, x + 200, y + 150], fill=(40 * s, 255 - 40 * s, 120))
        frames.append(np.asarray(img))
    return frames


def naive(clips: int) -> tuple[float, int]:
    import av

    start = time.perf_counter()
    total = 0
    for i in range(clips):
        buf = io.BytesIO()
        with av.open(buf, "w", format="mp4") as out:
            stream = out.add_stream("libx264", rate=FPS)
            stream.width, stream.height, stream.pix_fmt = W, H, "yuv420p"
            for arr in naive_frames(i):
                for packet in stream.encode(av.VideoFrame.from_ndarray(arr, format="rgb24")):
                    out.mux(packet)
            for packet in stream.encode():
                out.mux(packet)
        total += len(buf.getvalue())
    return (time.perf_counter() - start) / clips, total // clips


def imageio_pipe(clips: int) -> tuple[float, int] | None:
    """The same frames as ours, piped as raw yuv420p to imageio-ffmpeg's ffmpeg binary."""
    try:
        import imageio_ffmpeg
    except ImportError:
        return None
    exe = imageio_ffmpeg.get_ffmpeg_exe()
    factory = VideoFactory(VideoStyle(frames=FRAMES, fps=FPS), seed=0)
    start = time.perf_counter()
    total = 0
    with tempfile.TemporaryDirectory() as tmp:
        for i in range(clips):
            raw = b"".join(f.tobytes() for f in factory.frames(i, W, H))
            target = Path(tmp) / "x.mp4"
            subprocess.run([exe, "-y", "-loglevel", "error", "-f", "rawvideo", "-pix_fmt",
                            "yuv420p", "-s", f"{W}x{H}", "-r", str(FPS), "-i", "-", "-c:v",
                            "libx264", "-preset", "ultrafast", "-crf", "23", "-threads", "1",
                            "-fflags", "+bitexact", str(target)], input=raw, check=True)
            total += target.stat().st_size
    return (time.perf_counter() - start) / clips, total // clips


def peak_rss(args: list[str], cwd: Path) -> tuple[float, float]:
    """Wall seconds and peak RSS (MB, largest process of the run) of one CLI run."""
    wrapper = ("import resource, runpy, sys; sys.argv = ['mmdatagen'] + sys.argv[1:]\n"
               "try:\n    runpy.run_module('mmdatagen', run_name='__main__')\n"
               "except SystemExit:\n    pass\n"
               "r = max(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss,"
               " resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss)\n"
               "print(r, file=sys.stderr)\n")
    start = time.perf_counter()
    proc = subprocess.run([sys.executable, "-c", wrapper, *args, "-q", "--force"], cwd=cwd,
                          capture_output=True, text=True)
    if "Traceback" in proc.stderr or "error:" in proc.stderr:
        raise SystemExit(proc.stderr)
    return time.perf_counter() - start, int(proc.stderr.strip().splitlines()[-1]) / 1024


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--clips", type=int, default=6)
    args = ap.parse_args()
    clips = 2 if args.quick else args.clips
    print(f"video {W}x{H}, {FRAMES} frames at {FPS} fps, one process (per core), {clips} clips")
    h264, h264_bytes = ours(VideoStyle(frames=FRAMES, fps=FPS), clips)
    vp9, vp9_bytes = ours(VideoStyle(container="webm", frames=FRAMES, fps=FPS), clips)
    slow, slow_bytes = naive(max(1, clips // 2))
    print(f"  ours mp4/h264 : {1 / h264:6.2f} clips/s/core  {FRAMES / h264:6.1f} frames/s  "
          f"{h264_bytes / 1e3:8.1f} kB/clip")
    print(f"  ours webm/vp9 : {1 / vp9:6.2f} clips/s/core  {FRAMES / vp9:6.1f} frames/s  "
          f"{vp9_bytes / 1e3:8.1f} kB/clip")
    print(f"  naive (PIL RGB frames, rgb24->yuv, x264 default preset, default threads): "
          f"{1 / slow:6.2f} clips/s  {slow_bytes / 1e3:8.1f} kB/clip")
    print(f"  ratio ours h264 / naive: {slow / h264:5.1f}x")
    piped = imageio_pipe(max(1, clips // 2))
    if piped is None:
        print("  imageio-ffmpeg: not installed (pip install imageio-ffmpeg to compare)")
    else:
        print(f"  same frames piped to imageio-ffmpeg's ffmpeg (subprocess per clip): "
              f"{1 / piped[0]:6.2f} clips/s; PyAV in-process / pipe: {piped[0] / h264:5.2f}x")
    if args.quick:
        return
    print("memory: mmdatagen pool, 1 video per request, 1280x720x16, one worker")
    with tempfile.TemporaryDirectory() as tmp:
        for delivery in ("path", "data-url"):
            rows = []
            for n in (8, 32):
                cli = ["pool", "-n", str(n), "--pool-size", str(n), "--images-per-request", "0",
                       "--videos-per-request", "1", "--video-size", f"{W}x{H}",
                       "--video-frames", str(FRAMES), "--text-tokens", "16", "--tokenizer",
                       "words", "--workers", "1", "--delivery", delivery, "-o", f"m{n}.jsonl"]
                wall, rss = peak_rss(cli, Path(tmp))
                rows.append((n, wall, rss))
                print(f"  {delivery:8s} {n:3d} clips: {wall:6.1f} s  peak RSS {rss:6.0f} MB")
            print(f"  {delivery:8s} RSS ratio 32 / 8 clips: {rows[1][2] / rows[0][2]:.2f} "
                  f"(flat = 1.0; clips 4x)")


if __name__ == "__main__":
    sys.exit(main())
