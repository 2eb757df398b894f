"""Token counts and processor-cache entry sizes of videos and audio clips, per model family.

Pure functions of geometry values (what a model's ``video_preprocessor_config.json`` /
``preprocessor_config.json`` says), so the model registry (``vlm.py``) and the cache targets
can plug them in. Sources of the rules (checked against the code, not copied):

- Qwen2-VL / Qwen2.5-VL videos: transformers ``Qwen2VLVideoProcessor`` -- every frame is
  resized by the image rule (``smart_resize`` with the factor patch x merge and *per-frame*
  min/max pixels: the video processor's own, which a checkpoint may set apart from the image
  processor's), frames are padded to a multiple of the temporal patch (2) by repeating the
  last one, grid = (ceil(frames / 2), H / patch, W / patch), tokens = grid product / merge^2.
  vLLM 0.32 loads their clips with its ``qwen2_vl`` loader (``Qwen2VLVideoBackend``, picked for
  ``Qwen2VLVideoProcessor``): ``n = total / source_fps * 2`` frames, clamped to at least 4 and
  at most ``min(768, total)`` floored to even and ``total``, then floored to even; a clip
  whose source rate is unknown, or of one frame, is refused (checked against a live vLLM
  0.32 CPU server by the real-engine suite).
- Qwen3-VL videos: transformers ``Qwen3VLVideoProcessor`` / vLLM's ``qwen3_vl`` loader --
  frames sampled at ``fps`` (2) from the source rate: ``int(total / source_fps * fps)``,
  clamped to [min_frames 4, max_frames 768] and to the source's frames (vLLM caps fps at 30
  and assumes 24 fps when the source rate is unknown); resize with the *whole clip's* pixel
  budget: ``t_bar * h * w`` between min and max pixels (shipped config: 4096 and 25165824)
  with ``t_bar = round(frames / 2) * 2``; prompts add ``<{t:.1f} seconds>`` and the vision
  start/end markers per temporal group.
- vLLM processor-cache entry of a video: the processed pixel patches kept as uint8,
  patches x (3 x temporal_patch x patch x patch) bytes, plus the int64 (t, h, w) grid.
- vLLM 0.32's encoder-cache budget (``MultiModalBudget`` in vllm/multimodal/encoder_budget.py,
  ``compute_mm_encoder_budget`` in vllm/v1/core/encoder_cache_manager.py): see
  :func:`encoder_cache_budget`.
- Qwen2-Audio (and Qwen2.5-Omni's audio tower): Whisper features at 16 kHz, hop 160
  (one mel frame per 10 ms; Qwen2-Audio pads/truncates to 30 s), then two stride-2 stages:
  ``L = frames; tokens = ((L - 1) // 2 + 1 - 2) // 2 + 1`` (transformers
  ``Qwen2AudioProcessor`` / vLLM ``_get_feat_extract_output_lengths``): 5 s -> 125 tokens,
  30 s -> 750. vLLM resamples other rates to 16 kHz first.
"""
from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np

GRID_BYTES = 24  # int64 (t, h, w)
MAX_ASPECT_RATIO = 200


@dataclass(frozen=True)
class VideoGeometry:
    """How a model family's processor turns a clip into patches and tokens."""

    family: str
    patch_size: int
    merge_size: int
    temporal_patch_size: int
    min_pixels: int
    max_pixels: int
    clip_budget: bool  # True: min/max pixels bound t_bar*h*w (Qwen3-VL); False: each frame
    fps: float | None = None  # frame sampling rate (None: keep the loader's frames)
    min_frames: int = 4
    max_frames: int = 768
    loader_frames: int = -1  # vLLM loader's frame cap before the processor (-1: none)
    frame_rule: str = "qwen3"  # with fps: "qwen3" (Qwen3VLVideoBackend) or "qwen2" (Qwen2VL...)
    in_channels: int = 3
    pixel_dtype_bytes: int = 1  # vLLM keeps processed pixels as uint8
    marker_tokens: int = 2  # vision start/end around each video (per group for Qwen3-VL)
    timestamps: bool = False  # Qwen3-VL writes "<t seconds>" before every temporal group

    @property
    def factor(self) -> int:
        return self.patch_size * self.merge_size


# Shipped defaults (Qwen2.5-VL: preprocessor_config.json, min/max pixels 3136 / 12845056 per
# frame, vLLM's qwen2_vl loader at 2 fps; Qwen3-VL: video_preprocessor_config.json).
QWEN25_VL = VideoGeometry("qwen2.5-vl", 14, 2, 2, 3136, 12845056, clip_budget=False, fps=2.0,
                          min_frames=4, max_frames=768, frame_rule="qwen2")
QWEN3_VL = VideoGeometry("qwen3-vl", 16, 2, 2, 4096, 25165824, clip_budget=True, fps=2.0,
                         min_frames=4, max_frames=768, timestamps=True)
QWEN3_VL_MAX_FPS = 30.0
QWEN3_VL_UNKNOWN_FPS = 24.0


def sampled_frames(geom: VideoGeometry, total_frames: int, source_fps: float | None) -> list[int]:
    """Indices of the frames the model sees, in order (vLLM's loader, then the processor)."""
    if total_frames < 1:
        raise ValueError("a video needs at least one frame")
    if geom.fps is not None and geom.frame_rule == "qwen2":
        return _qwen2_frames(geom, total_frames, source_fps)
    if geom.fps is not None:  # Qwen3-VL: sample at fps from the source rate
        src = source_fps if source_fps and source_fps > 0 else QWEN3_VL_UNKNOWN_FPS
        fps = min(geom.fps, QWEN3_VL_MAX_FPS)
        n = int(total_frames / src * fps)
        n = min(max(n, geom.min_frames), geom.max_frames, total_frames)
        if n == 1:
            return [0]
        step = (total_frames - 1) / (n - 1)
        return [_round_half_even(i * step) for i in range(n)]
    n = total_frames if geom.loader_frames <= 0 else min(geom.loader_frames, total_frames)
    if n == total_frames:
        return list(range(n))
    # numpy.linspace(0, total - 1, n, dtype=int): truncation toward zero
    step = (total_frames - 1) / (n - 1) if n > 1 else 0.0
    return [int(i * step) for i in range(n)]


def _qwen2_frames(geom: VideoGeometry, total: int, source_fps: float | None) -> list[int]:
    """vLLM's ``Qwen2VLVideoBackend``: an even frame count from the source rate; indices from
    float32 steps (as its ``torch.arange``), the tail clamped to the last frame."""
    if not source_fps or source_fps <= 0:
        raise ValueError("Qwen2-VL video sampling needs the clip's frame rate")
    tp = geom.temporal_patch_size
    cap = min(geom.max_frames, total) // tp * tp
    n = min(max(total / source_fps * min(geom.fps or 2.0, QWEN3_VL_MAX_FPS), geom.min_frames),
            cap, total)
    n = int(n // tp) * tp
    if n <= 0:
        raise ValueError(f"{geom.family} needs at least {tp} frames, got {total}")
    step = np.float32(total / n)
    return [min(int(np.float32(i) * step), total - 1) for i in range(n)]


def _round_half_even(x: float) -> int:
    return int(round(x))


def resize(geom: VideoGeometry, frames: int, width: int, height: int) -> tuple[int, int]:
    """The (width, height) every frame is resized to."""
    if width <= 0 or height <= 0:
        raise ValueError(f"video size must be positive, got {width}x{height}")
    f = geom.factor
    if geom.clip_budget and (height < f or width < f):
        scale = max(f / height, f / width)
        height, width = int(height * scale), int(width * scale)
    if max(width, height) / min(width, height) > MAX_ASPECT_RATIO:
        raise ValueError(f"aspect ratio of {width}x{height} exceeds {MAX_ASPECT_RATIO}")
    h = round(height / f) * f
    w = round(width / f) * f
    if geom.clip_budget:
        tp = geom.temporal_patch_size
        t_bar = round(frames / tp) * tp
        area, real = t_bar * h * w, frames * height * width
    else:
        area, real = h * w, height * width
    if area > geom.max_pixels:
        beta = math.sqrt(real / geom.max_pixels)
        h = max(f, math.floor(height / beta / f) * f)
        w = max(f, math.floor(width / beta / f) * f)
    elif area < geom.min_pixels:
        beta = math.sqrt(geom.min_pixels / real)
        h = math.ceil(height * beta / f) * f
        w = math.ceil(width * beta / f) * f
    return w, h


def video_grid(geom: VideoGeometry, frames: int, width: int, height: int) -> tuple[int, int, int]:
    """(t, h, w) patch grid of a clip of ``frames`` processed frames."""
    if frames < 1:
        raise ValueError("a video needs at least one frame")
    if geom.clip_budget and frames < geom.temporal_patch_size:
        raise ValueError(f"{geom.family} needs at least {geom.temporal_patch_size} frames")
    w, h = resize(geom, frames, width, height)
    t = -(-frames // geom.temporal_patch_size)
    return t, h // geom.patch_size, w // geom.patch_size


def grid_tokens(geom: VideoGeometry, grid: tuple[int, int, int]) -> int:
    t, h, w = grid
    return t * h * w // geom.merge_size ** 2


def grid_processor_bytes(geom: VideoGeometry, grid: tuple[int, int, int]) -> int:
    """vLLM processor-cache bytes: uint8 patches of 3 x temporal x patch x patch, plus grid."""
    t, h, w = grid
    per_patch = geom.in_channels * geom.temporal_patch_size * geom.patch_size ** 2
    return t * h * w * per_patch * geom.pixel_dtype_bytes + GRID_BYTES


@dataclass(frozen=True)
class VideoCost:
    """What one clip costs a model: frames seen, grid, tokens, processor-cache bytes."""

    frames: int
    grid: tuple[int, int, int]
    tokens: int
    prompt_tokens: int
    processor_bytes: int

    def embedding_bytes(self, hidden_size: int, dtype_bytes: int = 2) -> int:
        """Encoder-cache bytes of the clip's embeddings (tokens x hidden size x dtype)."""
        return self.tokens * hidden_size * dtype_bytes


def video_cost(geom: VideoGeometry, total_frames: int, source_fps: float | None, width: int,
               height: int, count_text: Callable[[str], int] | None = None) -> VideoCost:
    """The cost of one clip as the server sees it (frame sampling included).

    ``count_text`` counts the tokens of Qwen3-VL's timestamp strings (without it each
    ``<t seconds>`` counts as 5 tokens, a typical count for Qwen's tokenizer).
    """
    indices = sampled_frames(geom, total_frames, source_fps)
    grid = video_grid(geom, len(indices), width, height)
    tokens = grid_tokens(geom, grid)
    prompt = tokens
    if geom.timestamps:
        for ts in timestamps(geom, indices, source_fps):
            text = f"<{ts:.1f} seconds>"
            prompt += (count_text(text) if count_text else 5) + geom.marker_tokens
    else:
        prompt += geom.marker_tokens
    return VideoCost(len(indices), grid, tokens, prompt, grid_processor_bytes(geom, grid))


def timestamps(geom: VideoGeometry, indices: list[int], source_fps: float | None) -> list[float]:
    """Qwen3-VL's per-temporal-group time: the mean of the group's first and last frame."""
    fps = source_fps if source_fps and source_fps > 0 else QWEN3_VL_UNKNOWN_FPS
    tp = geom.temporal_patch_size
    idx = list(indices)
    if len(idx) % tp:
        idx.extend([idx[-1]] * (tp - len(idx) % tp))
    secs = [i / fps for i in idx]
    return [(secs[i] + secs[i + tp - 1]) / 2 for i in range(0, len(secs), tp)]


@dataclass(frozen=True)
class AudioGeometry:
    """How an audio model family turns samples into tokens (Whisper-style features)."""

    family: str
    sampling_rate: int = 16000
    hop_length: int = 160
    chunk_seconds: float | None = 30.0  # Qwen2-Audio pads/truncates to 30 s; None: no limit
    n_mels: int = 128
    feature_dtype_bytes: int = 4  # float32 input features
    mask_dtype_bytes: int = 4  # int32 feature attention mask
    marker_tokens: int = 2  # audio start/end (<|audio_bos|> <|audio_eos|>)


QWEN2_AUDIO = AudioGeometry("qwen2-audio")
QWEN25_OMNI_AUDIO = AudioGeometry("qwen2.5-omni", chunk_seconds=None)


def resampled_samples(geom: AudioGeometry, samples: int, sample_rate: int) -> int:
    """Samples after resampling to the model's rate (librosa/scipy length: ceil)."""
    if sample_rate == geom.sampling_rate:
        return samples
    return -(-samples * geom.sampling_rate // sample_rate)


def mel_frames(geom: AudioGeometry, samples: int, sample_rate: int) -> int:
    """Feature frames the attention mask keeps (one per hop, truncated at the chunk)."""
    n = resampled_samples(geom, samples, sample_rate)
    if geom.chunk_seconds is not None:
        n = min(n, int(geom.chunk_seconds * geom.sampling_rate))
    return -(-n // geom.hop_length)


def audio_tokens(geom: AudioGeometry, samples: int, sample_rate: int) -> int:
    """Embedding tokens of one clip: two stride-2 stages over the mel frames."""
    frames = mel_frames(geom, samples, sample_rate)
    if frames <= 0:
        return 0
    return ((frames - 1) // 2 + 1 - 2) // 2 + 1


def audio_processor_bytes(geom: AudioGeometry, samples: int, sample_rate: int) -> int:
    """vLLM processor-cache bytes: float32 mel features (n_mels x padded frames) + the mask."""
    if geom.chunk_seconds is not None:  # padded to the full chunk
        frames = int(geom.chunk_seconds * geom.sampling_rate) // geom.hop_length
    else:
        frames = mel_frames(geom, samples, sample_rate)
    return frames * geom.n_mels * geom.feature_dtype_bytes + frames * geom.mask_dtype_bytes


@dataclass(frozen=True)
class AudioCost:
    """What one clip costs a model: tokens, prompt tokens (with its markers), processor bytes."""

    tokens: int
    prompt_tokens: int
    processor_bytes: int


def audio_cost(geom: AudioGeometry, samples: int, sample_rate: int) -> AudioCost:
    """:func:`audio_tokens`, the prompt tokens with the clip's markers, and
    :func:`audio_processor_bytes` of one clip."""
    tokens = audio_tokens(geom, samples, sample_rate)
    return AudioCost(tokens, tokens + geom.marker_tokens,
                     audio_processor_bytes(geom, samples, sample_rate))


def video_geometry(family: str, patch_size: int, merge_size: int,
                   temporal_patch_size: int = 2, min_pixels: int | None = None,
                   max_pixels: int | None = None) -> VideoGeometry:
    """The video rule of a model family with its own geometry values.

    ``qwen3-vl`` (Qwen3-VL, Qwen3.5/3.6): the clip budget rule with the shipped video config
    (4096 / 25165824 pixels) unless given; ``qwen2.5-vl`` / ``qwen2-vl``: the per-frame rule with
    the image processor's min/max pixels (its video processor reads the same config).
    """
    fam = family.lower().replace("_", "-")  # config.json's model_type spells qwen2_vl, qwen3_vl
    if fam.startswith("qwen3"):
        base = QWEN3_VL
    elif fam.startswith(("qwen2.5-vl", "qwen2-5-vl", "qwen2-vl")):
        base = QWEN25_VL
    else:
        raise ValueError(f"no video rule for model family {family!r}")
    return VideoGeometry(
        family, patch_size, merge_size, temporal_patch_size,
        base.min_pixels if min_pixels is None or base.clip_budget else min_pixels,
        base.max_pixels if max_pixels is None or base.clip_budget else max_pixels,
        base.clip_budget, base.fps, base.min_frames, base.max_frames, base.loader_frames,
        base.frame_rule, timestamps=base.timestamps)


def model_video_geometry(model: Any) -> VideoGeometry | None:
    """The video rule of a ``vlm.VisionModel``: its family's, with its patch geometry and its
    video processor's per-frame pixel limits when it has its own (else the image limits);
    None when the model has no patch geometry or its family no video rule."""
    if model.tokens_per_image is not None:
        return None
    vmin = getattr(model, "video_min_pixels", None)
    vmax = getattr(model, "video_max_pixels", None)
    try:
        return video_geometry(model.family, model.patch_size, model.merge_size,
                              model.temporal_patch_size,
                              vmin if vmin is not None else model.min_pixels,
                              vmax if vmax is not None else model.max_pixels)
    except ValueError:
        return None


# -- vLLM 0.32's encoder-cache budget ---------------------------------------------------------

VLLM_DEFAULT_MM_LIMIT = 999  # vLLM's items per prompt of a modality --limit-mm-per-prompt omits
VLLM_MAX_FRAMES_PER_VIDEO = 14  # qwen2_vl.py _MAX_FRAMES_PER_VIDEO (the budget's video length)
_FACTOR_SEARCH_LIMIT = 10**6  # above this many tokens per side there is no real pixel limit


def _most_features(max_tokens: int) -> int:
    """vLLM's ``get_image_size_with_most_features``, in merged patches: the largest count up to
    ``max_tokens`` whose closest factor pair has an aspect ratio of at most 200."""
    for n in range(max_tokens, 0, -1):
        side = math.isqrt(n)
        if side > _FACTOR_SEARCH_LIMIT:
            return n
        low = math.isqrt(max(0, (n - 1) // MAX_ASPECT_RATIO))  # below it the ratio exceeds 200
        for d in range(side, max(low, 1) - 1, -1):
            if n % d == 0:
                if n // d <= MAX_ASPECT_RATIO * d:
                    return n
                break  # the closest pair is too elongated: so is every other
    return 0


def encoder_cache_budget(model: Any, max_num_batched_tokens: int,
                         limit_mm_per_prompt: dict[str, int] | None = None,
                         max_model_len: int | None = None, mm_embeds: bool = False) -> int:
    """vLLM 0.32's encoder cache size in embedding tokens, as its startup log prints it
    ("Encoder cache will be initialized with a budget of N tokens").

    The rule (``MultiModalBudget`` / ``compute_mm_encoder_budget``): the modalities whose
    ``limit_mm_per_prompt`` is above 0 are active (vLLM gives an omitted modality 999 items,
    so ``{"image": 3}`` keeps videos active; None: vLLM's default, every modality); each active
    modality's largest item in tokens is computed with ONE item of it per prompt; the budget is
    ``max(max_num_batched_tokens, largest item over the active modalities)``, and 0 when no
    modality is active (no encoder cache). The item limits' values, chunked prefill and
    ``max_num_seqs`` change only how many items vLLM profiles with, not the budget.
    ``mm_embeds``: the engine accepts pre-computed embeddings (``--enable-mm-embeds``, and always
    under an EC-connector consumer such as Dynamo's ``ec_both`` connector): a modality whose limit
    is 0 is then embedding-only and still active, so every modality of the model counts.

    Largest items, for ``model`` (a ``vlm.VisionModel``):
    - an image: ``tokens_per_image`` for a generic model; else the image processor's
      ``max_pixels // (patch x merge)^2`` merged patches, lowered to the first count whose
      closest factor pair keeps the aspect ratio within 200;
    - a video, Qwen2-VL / Qwen2.5-VL: that image size over as many frames as the context holds,
      ``ceil(frames / temporal) x image tokens <= max_model_len``, at most 14 frames (at least
      1): ``image tokens x min(max_model_len // image tokens, 7)`` (``max_model_len`` None: the
      14-frame cap binds, as it does from 7 x image tokens up);
    - a video, Qwen3-VL: two frames at the video processor's ``max_pixels / temporal``;
    - other families: no video rule (their videos are not counted).
    """
    limits = limit_mm_per_prompt or {}
    largest = []
    image = _max_image_tokens(model)
    if (mm_embeds or limits.get("image", VLLM_DEFAULT_MM_LIMIT) > 0) and image > 0:
        largest.append(image)
    if mm_embeds or limits.get("video", VLLM_DEFAULT_MM_LIMIT) > 0:
        largest.append(_max_video_tokens(model, image, max_model_len))
    if not largest:
        return 0
    return max(int(max_num_batched_tokens), *largest)


def _max_image_tokens(model: Any) -> int:
    if model.tokens_per_image is not None:
        return int(model.tokens_per_image)
    return _most_features(model.max_pixels // (model.factor * model.factor))


def _max_video_tokens(model: Any, image_tokens: int, max_model_len: int | None) -> int:
    """The largest video item vLLM 0.32 budgets for (0: the family has no video rule)."""
    if model.tokens_per_image is not None or image_tokens <= 0:
        return 0
    family = str(model.family).lower().replace("_", "-")
    tp = max(1, int(model.temporal_patch_size))
    if family.startswith("qwen3"):
        vmax = getattr(model, "video_max_pixels", None) or QWEN3_VL.max_pixels
        return _most_features(vmax // tp // (model.factor * model.factor)) * -(-2 // tp)
    if not family.startswith(("qwen2.5-vl", "qwen2-5-vl", "qwen2-vl")):
        return 0
    groups_fit = (max_model_len // image_tokens) if max_model_len is not None else \
        VLLM_MAX_FRAMES_PER_VIDEO
    frames = tp * groups_fit if groups_fit >= 1 else 1
    frames = max(1, min(frames, VLLM_MAX_FRAMES_PER_VIDEO))
    return -(-frames // tp) * image_tokens
