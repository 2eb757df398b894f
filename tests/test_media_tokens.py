"""Video and audio token / processor-cache rules (mmdatagen.media_tokens).

The vectors were computed offline with the libraries themselves (no model download):
transformers 5.19.0 ``Qwen2VLVideoProcessor(min_pixels=3136, max_pixels=12845056)`` and
``Qwen3VLVideoProcessor(size={"shortest_edge": 4096, "longest_edge": 25165824})``
``.get_num_of_video_patches(frames, height, width)``; vLLM 0.32.0
``Qwen2VLVideoBackend`` and ``Qwen3VLVideoBackend`` (both at fps=2)
``.compute_frames_index_to_sample`` (the loaders vLLM picks for Qwen2-VL's and Qwen3-VL's video
processors; the real-engine suite checks the Qwen2-VL rule's token counts on a live server); ``WhisperFeatureExtractor(feature_size=128)`` attention
mask sums with Qwen2-Audio's length rule.
"""
from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from mmdatagen.media_tokens import (
    QWEN2_AUDIO,
    QWEN3_VL,
    QWEN25_OMNI_AUDIO,
    QWEN25_VL,
    audio_processor_bytes,
    audio_tokens,
    grid_processor_bytes,
    mel_frames,
    resize,
    sampled_frames,
    timestamps,
    video_cost,
    video_geometry,
    video_grid,
)

# (frames, height, width) -> patches (Qwen2.5-VL, Qwen3-VL)
PATCHES = {
    (16, 720, 1280): (38272, 28160), (32, 720, 1280): (76544, 46080),
    (15, 480, 640): (12512, 9600), (4, 360, 640): (2392, 1760),
    (768, 1080, 1920): (4133376, 43008), (2, 64, 48): (16, 16), (9, 1080, 1920): (53820, 40800),
}


@pytest.mark.parametrize("key", sorted(PATCHES))
def test_patches_match_the_hf_processors(key):
    frames, h, w = key
    for geom, want in zip((QWEN25_VL, QWEN3_VL), PATCHES[key]):
        t, gh, gw = video_grid(geom, frames, w, h)
        assert t * gh * gw == want


# (total frames, source fps) -> vLLM's frame indices (qwen2_vl loader; qwen3_vl loader), None:
# refused (Qwen2-VL needs the source rate and 2 frames)
SAMPLING = {
    (300, 30.0): (list(range(0, 300, 15)),
                  [0, 16, 31, 47, 63, 79, 94, 110, 126, 142, 157, 173, 189, 205, 220, 236, 252,
                   268, 283, 299]),
    (100, 0.0): (None, [0, 14, 28, 42, 57, 71, 85, 99]),
    (45, 29.97): ([0, 11, 22, 33], [0, 15, 29, 44]),
    (16, 2.0): (list(range(16)), list(range(16))),
    (3, 2.0): ([0, 1], [0, 1, 2]),
    (6, 8.0): ([0, 1, 3, 4], [0, 2, 3, 5]),
    (7, 1.0): (list(range(6)), list(range(7))),
    (40, 2.0): (list(range(40)), list(range(40))),
    (1, 2.0): (None, [0]),
}


@pytest.mark.parametrize("key", sorted(SAMPLING))
def test_frame_sampling_matches_vllm(key):
    total, fps = key
    want25, want3 = SAMPLING[key]
    if want25 is None:
        with pytest.raises(ValueError):
            sampled_frames(QWEN25_VL, total, fps)
    else:
        assert sampled_frames(QWEN25_VL, total, fps) == want25
    assert sampled_frames(QWEN3_VL, total, fps) == want3


def test_qwen2_vl_2000_and_451_frames():
    idx = sampled_frames(QWEN25_VL, 2000, 25.0)
    assert len(idx) == 160 and idx[:5] == [0, 12, 25, 37, 50] and idx[-3:] == [1962, 1975, 1987]
    idx = sampled_frames(QWEN25_VL, 451, 30.0)
    assert len(idx) == 30 and idx[-3:] == [405, 420, 435]


def test_qwen3_vl_2000_frames_at_25_fps_sample_160():
    idx = sampled_frames(QWEN3_VL, 2000, 25.0)
    assert len(idx) == 160 and idx[:4] == [0, 13, 25, 38] and idx[-1] == 1999


def test_clip_cost_and_processor_bytes():
    # 16 frames of 1280x720 at 8 fps (2 s): Qwen3-VL samples 4 frames -> 2 temporal groups
    cost = video_cost(QWEN3_VL, 16, 8.0, 1280, 720, count_text=lambda s: len(s.split()) + 3)
    assert cost.frames == 4 and cost.grid[0] == 2
    per_patch = 3 * 2 * 16 * 16
    assert cost.processor_bytes == cost.grid[0] * cost.grid[1] * cost.grid[2] * per_patch + 24
    assert cost.tokens == cost.grid[0] * cost.grid[1] * cost.grid[2] // 4
    stamps = timestamps(QWEN3_VL, [0, 5, 10, 15], 8.0)
    assert stamps == [(0 + 5 / 8) / 2, (10 / 8 + 15 / 8) / 2]
    assert cost.prompt_tokens == cost.tokens + 2 * (5 + 2)  # "<0.3 seconds>" -> 2 words + 3
    q25 = video_cost(QWEN25_VL, 16, 8.0, 1280, 720)  # 2 s at 8 fps: 4 frames at 2 fps
    assert (q25.frames, q25.grid) == (4, (2, 52, 92)) and q25.tokens == 2 * 52 * 92 // 4
    assert q25.prompt_tokens == q25.tokens + 2
    assert grid_processor_bytes(QWEN25_VL, q25.grid) == 2 * 52 * 92 * 3 * 2 * 14 * 14 + 24
    assert q25.embedding_bytes(2048) == q25.tokens * 2048 * 2


@given(frames=st.integers(2, 2000), w=st.integers(32, 4000), h=st.integers(32, 4000))
def test_qwen3_vl_clip_budget_holds(frames, w, h):
    if max(w, h) / min(w, h) > 200:
        return
    rw, rh = resize(QWEN3_VL, frames, w, h)
    assert rw % 32 == 0 and rh % 32 == 0
    # the processor holds the frames rounded to its temporal patch (2) to the budget, then
    # scales by the true count: both overshoot only at the 32-pixel floor (149 frames of
    # 145x1041 stay 160x1056: 148 frames of it fit, 149 would not)
    t_bar = round(frames / QWEN3_VL.temporal_patch_size) * QWEN3_VL.temporal_patch_size
    if min(frames, t_bar) * rw * rh > QWEN3_VL.max_pixels:
        assert min(rw, rh) == 32


@given(frames=st.integers(1, 64), w=st.integers(28, 3000), h=st.integers(28, 3000))
def test_qwen25_vl_grid_is_per_frame(frames, w, h):
    if max(w, h) / min(w, h) > 200:
        return
    t, gh, gw = video_grid(QWEN25_VL, frames, w, h)
    assert t == -(-frames // 2)
    assert (gw * 14, gh * 14) == resize(QWEN25_VL, 1, w, h) == resize(QWEN25_VL, frames, w, h)


# samples at 16 kHz -> (mel frames, Qwen2-Audio tokens)
AUDIO = {80000: (500, 125), 16000: (100, 25), 480000: (3000, 750), 800000: (3000, 750),
         12345: (78, 19), 159: (1, 0), 161: (2, 0)}


@pytest.mark.parametrize("samples", sorted(AUDIO))
def test_qwen2_audio_tokens_match_whisper_features(samples):
    assert (mel_frames(QWEN2_AUDIO, samples, 16000), audio_tokens(QWEN2_AUDIO, samples, 16000)) \
        == AUDIO[samples]


def test_audio_resampling_omni_and_cache_bytes():
    assert audio_tokens(QWEN2_AUDIO, 5 * 44100, 44100) == 125  # resampled to 16 kHz first
    assert audio_tokens(QWEN2_AUDIO, 60 * 16000, 16000) == 750  # truncated at 30 s
    assert audio_tokens(QWEN25_OMNI_AUDIO, 60 * 16000, 16000) == 1500  # no 30 s window
    assert audio_processor_bytes(QWEN2_AUDIO, 16000, 16000) == 3000 * 128 * 4 + 3000 * 4
    assert audio_processor_bytes(QWEN25_OMNI_AUDIO, 16000, 16000) == 100 * 128 * 4 + 100 * 4


def test_media_reuse_one_cache_for_every_modality(tmp_path):
    from click.testing import CliRunner

    from mmdatagen.analysis.reuse import media_reuse
    from mmdatagen.caches import get_target
    from mmdatagen.cli import cli
    from mmdatagen.io.manifest import read_manifest
    from mmdatagen.vlm import get_model

    out = tmp_path / "d.jsonl"
    result = CliRunner().invoke(cli, ["pool", "-n", "12", "--pool-size", "3",
                                      "--videos-per-request", "1", "--audios-per-request", "1",
                                      "--image-size", "32x24", "--video-size", "64x48",
                                      "--video-frames", "4", "--audio-duration", "0.5",
                                      "--text-tokens", "4", "--tokenizer", "words", "-q",
                                      "-o", str(out)])
    assert result.exit_code == 0, result.output
    manifest = read_manifest(out)
    model = get_model("qwen3-vl-30b-a3b")
    big = get_target("vllm-processor")
    reuse = media_reuse(manifest, model, big, big.capacity(4))
    for modality in ("image", "video", "audio"):
        r = reuse.by_modality[modality]
        assert (r.references, r.distinct, r.hits) == (12, 3, 9)  # only compulsory misses
    video = manifest.media["video"].items[0]
    cost = video_cost(video_geometry(model.family, model.patch_size, model.merge_size),
                      4, video.fps, 64, 48)
    assert reuse.by_modality["video"].tokens_referenced == 12 * cost.tokens
    assert reuse.by_modality["video"].bytes_referenced == 12 * cost.processor_bytes
    tiny = media_reuse(manifest, model, big, 1)  # nothing fits: no hits anywhere
    assert tiny.total.hits == 0 and tiny.total.references == 36


def test_model_folder_video_limits_and_model_type(tmp_path):
    """A checkpoint's own video processor limits (processor_config.json's video_processor, as
    transformers 5 saves it) size its clips; config.json's model_type spelling (qwen2_vl) has
    the Qwen2-VL rule. Numbers from the tiny Qwen2-VL the real-engine suite serves: a 64x48
    frame is resized to 392x280 (>= 100,352 pixels), 4 frames = 2 groups of 560 patches."""
    import json

    from mmdatagen.media_tokens import model_video_geometry
    from mmdatagen.vlm import resolve_model

    (tmp_path / "config.json").write_text(json.dumps({
        "model_type": "qwen2_vl", "text_config": {"hidden_size": 128},
        "vision_config": {"patch_size": 14, "spatial_merge_size": 2, "temporal_patch_size": 2}}))
    size = {"shortest_edge": 3136, "longest_edge": 1003520}
    proc = {"image_processor": {"patch_size": 14, "merge_size": 2, "size": size},
            "video_processor": {"size": {"shortest_edge": 100352, "longest_edge": 602112}}}
    (tmp_path / "processor_config.json").write_text(json.dumps(proc))
    model = resolve_model(str(tmp_path))
    geom = model_video_geometry(model)
    assert geom is not None and (geom.min_pixels, geom.max_pixels) == (100352, 602112)
    cost = video_cost(geom, 4, 2.0, 64, 48)
    assert (cost.frames, cost.grid, cost.tokens) == (4, (2, 20, 28), 280)
    assert cost.processor_bytes == 1120 * 1176 + 24
    assert model.image_tokens(64, 48) == 4  # images keep the image processor's limits
    del proc["video_processor"]  # no video processor config: the image limits
    (tmp_path / "processor_config.json").write_text(json.dumps(proc))
    geom = model_video_geometry(resolve_model(str(tmp_path)))
    assert geom is not None and (geom.min_pixels, geom.max_pixels) == (3136, 1003520)


# -- vLLM 0.32's encoder-cache budget (media_tokens.encoder_cache_budget) ----------------------

def _tiny_qwen2vl(max_pixels: int = 1003520):
    """The real-engine suite's tiny Qwen2-VL (patch 14, merge 2, 1,280 merged patches at most)."""
    from mmdatagen.vlm import VisionModel

    return VisionModel(name="tiny", hidden_size=128, family="qwen2_vl", patch_size=14,
                       merge_size=2, min_pixels=3136, max_pixels=max_pixels)


# (image max_pixels, max_num_batched_tokens, max_model_len, limit_mm_per_prompt) -> budget.
# "logged": the budget a vLLM 0.32 CPU server printed at startup with these flags
# ("Encoder cache will be initialized with a budget of N tokens"; tests/real_engine/
# test_encoder_budget.py). "vllm": vLLM 0.32's MultiModalBudget for the same settings, computed
# in the engine virtualenv (tests/real_engine/vllm_budget.py; 180 settings agreed, these are some).
TINY = 28 * 28 * 1280
MEASURED_BUDGETS = [
    ("logged", TINY, 512, 4096, {"image": 3, "video": 0}, 1280),  # one image item, not 3
    ("logged", TINY, 8192, 4096, {"image": 1, "video": 0}, 8192),
    ("logged", TINY, 2048, 4096, {"image": 2, "video": 1}, 3840),  # a 6-frame video
    ("logged", TINY, 512, 8192, {"image": 3}, 7680),  # an omitted modality counts 999 items
    ("vllm", TINY, 512, 4096, {"image": 1, "video": 0}, 1280),
    ("vllm", TINY, 2048, 4096, {"image": 6, "video": 2}, 3840),
    ("vllm", TINY, 256, 1024, {"image": 0, "video": 1}, 1280),  # video longer than the context
    ("vllm", TINY, 1000, 2048, {"image": 3}, 1280),  # one 2-frame group fits the context
    ("vllm", TINY, 5000, 32768, {"image": 3}, 8960),  # the 14-frame cap: 7 groups
    ("vllm", TINY, 5000, 8192, {"image": 0, "video": 0}, 0),  # no encoder cache
    ("vllm", 28 * 28 * 1279, 256, 4096, {"image": 3, "video": 0}, 1278),  # 1 x 1279 too thin
    ("vllm", 28 * 28 * 1279, 1000, 8192, {"image": 3}, 7668),
    ("vllm", 28 * 28 * 401, 256, 2048, {"image": 3}, 2000),  # 401 is prime: 20 x 20
    ("vllm", 28 * 28 * 401, 256, 4096, {"image": 0, "video": 1}, 2800),
    ("vllm", 28 * 28 * 401, 5000, 1024, {"image": 3}, 5000),
]


@pytest.mark.parametrize("source,max_pixels,batched,model_len,limits,budget", MEASURED_BUDGETS)
def test_encoder_cache_budget_matches_vllm(source, max_pixels, batched, model_len, limits, budget):
    from mmdatagen.media_tokens import encoder_cache_budget

    model = _tiny_qwen2vl(max_pixels)
    assert encoder_cache_budget(model, batched, limits, model_len) == budget


def test_encoder_cache_budget_under_an_ec_connector():
    """Dynamo's connector (ec_both) makes vLLM accept pre-computed embeddings: a modality whose
    limit is 0 stays active as embedding-only. Logged by the connector's server in
    tests/real_engine/test_dynamo_connector.py: 3,840 tokens (a 6-frame video) with
    ``{"image": 4, "video": 0}``, batched 2,048, context 4,096; the front tier's default follows."""
    from mmdatagen.caches import get_target
    from mmdatagen.caches.entries import front_budget
    from mmdatagen.media_tokens import encoder_cache_budget

    model = _tiny_qwen2vl()
    limits = {"image": 4, "video": 0}
    assert encoder_cache_budget(model, 2048, limits, 4096) == 2048
    assert encoder_cache_budget(model, 2048, limits, 4096, mm_embeds=True) == 3840
    assert front_budget(get_target("dynamo-connector"), model, None, 2048, limits,
                        4096) == 3840


def test_encoder_cache_budget_registry_models():
    """Shipped geometries, by the same rule: Qwen2.5-VL (16,384-token images) budgets a 14-frame
    video (7 groups) unless videos are off; Qwen3-VL's largest image (16,384) outweighs its
    budget video (two frames at 25,165,824 / 2 pixels: 12,288); a generic model has no video
    rule; ``max_model_len`` None lets the frame cap bind."""
    from mmdatagen.media_tokens import encoder_cache_budget
    from mmdatagen.vlm import generic_model, get_model

    q25 = get_model("qwen2.5-vl-7b")
    assert encoder_cache_budget(q25, 8192) == 7 * 16384
    assert encoder_cache_budget(q25, 8192, {"image": 4, "video": 0}) == 16384
    assert encoder_cache_budget(q25, 8192, None, 32768) == 2 * 16384
    q3 = get_model("qwen3-vl-30b-a3b")
    assert encoder_cache_budget(q3, 8192) == 16384
    assert encoder_cache_budget(q3, 8192, {"image": 0}) == 12288
    assert encoder_cache_budget(q3, 20000, {"video": 0}) == 20000
    assert encoder_cache_budget(generic_model(576, 4096), 512) == 576


def _closest_pair_ok(n: int) -> bool:
    d = max(k for k in range(1, int(n ** 0.5) + 1) if n % k == 0)
    return (n // d) / d <= 200


@given(st.integers(1, 6000))
def test_most_features_is_vllms_factor_search(max_tokens):
    """The bounded divisor search equals vLLM's plain one: the largest count up to the limit
    whose closest factor pair has an aspect ratio within 200."""
    from mmdatagen.media_tokens import _most_features

    want = next(n for n in range(max_tokens, 0, -1) if _closest_pair_ok(n))
    assert _most_features(max_tokens) == want


def test_front_budget_given_rule_and_single_tier():
    """caches.entries.front_budget: the user's logged value wins; else the rule with the engine
    settings given; a target without a front tier has none."""
    from mmdatagen.caches import get_target
    from mmdatagen.caches.entries import front_budget

    two_tier, single = get_target("dynamo-connector"), get_target("vllm-processor")
    model = _tiny_qwen2vl()
    assert front_budget(two_tier, model, 3150) == 3150
    # the connector keeps videos active (embedding-only): the reference's 3,840 tokens with
    # these flags was logged by a server running Dynamo's connector; plain vLLM logs 1,280
    assert front_budget(two_tier, model, None, 512, {"image": 3, "video": 0}, 4096) == 3840
    assert front_budget(two_tier, model, None, 2048, {"image": 2, "video": 1}, 4096) == 3840
    assert front_budget(two_tier, model) == 8960  # 8,192 batched tokens, vLLM's default limits
    assert front_budget(single, model) is None
