"""Content and output specs of the generators: text, pixels, delivery, where the files go."""
from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, fields
from typing import TYPE_CHECKING, Any, Literal

from ..plans.media import DEFAULT_VIDEO_SIZE
from . import common
from .base import SpecError, option, spec

if TYPE_CHECKING:  # the styles are built where used (the CLI starts without numpy or PyAV)
    from ..content.audio import AudioStyle
    from ..content.video import VideoStyle

ImageContent = Literal["noise", "photo", "solid", "folder", "hf"]
ImageFormat = Literal["jpeg", "png"]
Delivery = Literal["path", "data-url", "url"]
OutputFormat = Literal["jsonl", "hf"]

IMAGE_CONTENTS: tuple[str, ...] = ("noise", "photo", "solid", "folder", "hf")
IMAGE_FORMATS: tuple[str, ...] = ("jpeg", "png")
DELIVERIES: tuple[str, ...] = ("path", "data-url", "url")


@spec
@dataclass(frozen=True)
class Content:
    """Text and pixels of every row, and how images are delivered. Defaults: seed A's (pool);
    ``SLIDING_WINDOW_CONTENT`` holds seed B's."""

    text_tokens: int = option(400, "--text-tokens", "Text tokens per request (exact, "
                              "re-tokenised).", min=0, max=10_000_000)
    tokenizer: str = option("qwen3-vl", "--tokenizer", "words | qwen2.5 | qwen3-vl | qwen3.6 | "
                            "a registry model | a local tokenizer.json or folder.")
    shared_prefix_tokens: int = option(0, "--shared-prefix-tokens", "Start every text with the "
                                       "same N tokens (KV prefix-cache experiments).", min=0,
                                       max=10_000_000)
    output_length: int | None = option(None, "--output-length", "Per-row output_length (max "
                                       "output tokens).", kind=int, min=1, max=10_000_000)
    image_size: str = option("640x480", "--image-size", "WxH (W wide, H tall) or weighted list "
                             "640x480:3,1024x768:1.")
    image_content: ImageContent = option("photo", "--image-content", "Pixels: uniform noise, "
                                         "photo-like scene, solid colour, a user folder, or a "
                                         "local Hugging Face dataset.", choices=IMAGE_CONTENTS)
    image_source_dir: str | None = option(None, "--image-source-dir", "Folder of images for "
                                          "--image-content folder (resized; each slot distinct).",
                                          file_okay=False)
    hf_dataset: str | None = option(None, "--hf-dataset", "save_to_disk folder for "
                                    "--image-content hf (resized; each slot distinct).",
                                    file_okay=False)
    hf_image_column: str | None = option(None, "--hf-image-column", "Image column of "
                                         "--hf-dataset (default: image).")
    image_format: ImageFormat = option("jpeg", "--image-format", "Encoding of every image.",
                                       choices=IMAGE_FORMATS)
    jpeg_quality: int = option(85, "--jpeg-quality", "JPEG quality.", min=1, max=100)
    png_compress_level: int | None = option(None, "--png-compress-level", "0-9; default 0 "
                                            "(stored, fast) for noise, 6 otherwise.", kind=int,
                                            min=0, max=9)
    target_bytes: int | None = option(None, "--target-bytes", "Pad or re-encode each image to "
                                      "exactly N bytes.", kind=int, min=1, max=2**31 - 1)
    delivery: Delivery = option("path", "--delivery", "File paths, inline base64 data URLs, or "
                                "http(s) URLs under --base-url.", choices=DELIVERIES)
    image_dir: str | None = option(None, "--image-dir", "Folder for image files (default: "
                                   "<output>_images/ beside the output).", file_okay=False)
    path_prefix: str | None = option(None, "--path-prefix", "Folder written into rows instead of "
                                     "the image folder (where the files will be mounted, e.g. "
                                     "/data/images).")
    base_url: str | None = option(None, "--base-url", "Base URL for --delivery url.")
    image_uuids: bool = option(False, "--image-uuids", "Add image_uuids (stable per image "
                               "content).", negatable=True)

    def check(self) -> None:
        if self.base_url is not None and self.delivery != "url":
            raise SpecError("base_url", f"applies to `delivery` url, not {self.delivery}")
        if self.path_prefix is not None and self.delivery != "path":
            raise SpecError("path_prefix", f"applies to `delivery` path, not {self.delivery}")
        if self.image_content == "folder" and not self.image_source_dir:
            raise SpecError("image_content", "folder needs `image_source_dir` DIR")
        if self.image_content == "hf" and not self.hf_dataset:
            raise SpecError("image_content", "hf needs `hf_dataset` DIR")


@spec
@dataclass(frozen=True)
class Media:
    """Video and audio items (used only when a workload asks for them; defaults in brackets)."""

    video_size: str | None = option(None, "--video-size", "Video WxH (even sides) or weighted "
                                    "list 640x360:3,1280x720:1 (default "
                                    f"{DEFAULT_VIDEO_SIZE}).")
    video_frames: int | None = option(None, "--video-frames", "Frames per video (default 16).",
                                      kind=int, min=1, max=100_000)
    video_duration: float | None = option(None, "--video-duration", "Seconds per video (frames = "
                                          "duration x fps; overrides --video-frames).",
                                          kind=float, min=0, min_open=True, max=86400)
    video_fps: float | None = option(None, "--video-fps", "Frames per second (default 2).",
                                     kind=float, min=0, min_open=True, max=240)
    video_format: str | None = option(None, "--video-format", "Container: mp4 (default) or "
                                      "webm.")
    video_codec: str | None = option(None, "--video-codec", "h264 (mp4 default), vp9 (webm "
                                     "default), hevc or vp8.")
    video_content: str | None = option(None, "--video-content", "Moving shapes over a gradient "
                                       "(default) or per-frame noise (worst case).",
                                       choices=("shapes", "noise"))
    audio_format: str | None = option(None, "--audio-format", "wav (16-bit PCM, default) or mp3.")
    audio_sample_rate: int | None = option(None, "--audio-sample-rate", "Hz, 8000..192000 "
                                           "(default 16000).", kind=int, min=8000, max=192000)
    audio_channels: int | None = option(None, "--audio-channels", "1 or 2 (default 1).",
                                        kind=int, min=1, max=2)
    audio_duration: float | None = option(None, "--audio-duration", "Seconds per audio clip "
                                          "(default 5).", kind=float, min=0, min_open=True,
                                          max=3600)

    def styles(self, modalities: Iterable[str]
               ) -> tuple[dict[str, VideoStyle | AudioStyle], dict[str, Any]]:
        """Video/audio styles for the modalities in use, and the options that fix their bytes."""
        from ..content.audio import AudioStyle
        from ..content.video import VideoStyle

        used = set(modalities)
        styles: dict[str, VideoStyle | AudioStyle] = {}
        if "video" in used:
            styles["video"] = VideoStyle(
                container=self.video_format or "mp4", codec=self.video_codec,
                fps=2.0 if self.video_fps is None else self.video_fps,
                frames=16 if self.video_frames is None else self.video_frames,
                duration=self.video_duration, content=self.video_content or "shapes")
        if "audio" in used:
            styles["audio"] = AudioStyle(
                fmt=self.audio_format or "wav",
                sample_rate=16000 if self.audio_sample_rate is None else self.audio_sample_rate,
                channels=1 if self.audio_channels is None else self.audio_channels,
                duration=5.0 if self.audio_duration is None else self.audio_duration)
        for style in styles.values():
            style.validate()
        given = {f.name: getattr(self, f.name) for f in fields(self)}
        # only the options of the modalities in use fix bytes: record those
        return styles, {k: v for k, v in given.items()
                        if v is not None and k.split("_")[0] in styles}


SLIDING_WINDOW_CONTENT: dict[str, Any] = {
    "text_tokens": 8000, "tokenizer": "qwen3.6", "image_size": "2400x1080",
    "delivery": "data-url"}


@spec
@dataclass(frozen=True)
class Output:
    """Where a generator writes and how it runs (none of this changes the dataset's bytes)."""

    seed: int = common.seed()
    output: str | None = option(None, "--output", "Output JSONL path; a folder (ending in / or "
                                "existing) gets the default file name inside it.", short="-o")
    shard_index: int = option(0, "--shard-index", "This shard's index (0-based).", min=0,
                              max=1_000_000)
    num_shards: int = option(1, "--num-shards", "Split rows into contiguous shards; shards "
                             "concatenate to the full file.", min=1, max=1_000_000)
    workers: int = common.workers("Processes for image work")
    output_format: OutputFormat = option("jsonl", "--output-format", "hf: also a Hugging Face "
                                         "dataset <name>_hf/ (Image feature).",
                                         choices=("jsonl", "hf"))
    hf_parquet: bool = option(False, "--hf-parquet", "Also <name>.parquet (implies "
                              "--output-format hf).", is_flag=True)
    quiet: bool = common.quiet()
    force: bool = common.force()

    def check(self) -> None:
        if self.shard_index >= self.num_shards:
            raise SpecError("shard_index", f"must be in 0..{self.num_shards - 1}")

    def path(self, default_name: str) -> str:
        """The output file: as given, the default name, or the default name inside a folder."""
        import os

        out = self.output
        if not out:
            return default_name
        if out.endswith(("/", os.sep)) or os.path.isdir(out):
            return os.path.join(out, default_name)
        return out

    @property
    def hf(self) -> bool:
        return self.output_format == "hf" or self.hf_parquet
