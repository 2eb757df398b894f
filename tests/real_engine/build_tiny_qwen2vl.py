#!/usr/bin/env python3
"""Build a tiny, randomly initialised Qwen2-VL checkpoint offline, keeping the real image geometry.

Run it with the engine virtualenv's python (transformers 5.x, tokenizers, torch, torchvision):

    python build_tiny_qwen2vl.py --output DIR [--seed 0]

What it writes into DIR (a Hugging Face folder vLLM can serve):
- config.json / generation_config.json / model.safetensors: a 1-layer text model (hidden 128,
  2 heads, 1 KV head, head dim 64) and a depth-1 vision tower (embed 64) with the real Qwen2-VL
  geometry: patch 14, temporal patch 2, spatial merge 2; random weights from ``--seed``;
- a byte-level BPE tokenizer trained here on seeded synthetic text, plus the Qwen special tokens,
  and a Qwen2-VL-style chat template (written for this project);
- the image processor with the real limits (min 56*56, max 28*28*1280 pixels), the video processor
  (per-frame limits 128*28*28 and 768*28*28: vLLM serves videos with it) and the processor.

The build is deterministic: the same seed writes the same bytes. It checks the image token counts
against the Qwen2-VL formula before finishing, and writes ``BUILD_STAMP`` last, so a folder with a
matching stamp is reused as it is.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import random
import shutil
import sys
from pathlib import Path

RECIPE = 3
STAMP = "BUILD_STAMP"
PATCH = 14
MERGE = 2
TEMPORAL = 2
MIN_PIXELS = 56 * 56
MAX_PIXELS = 28 * 28 * 1280
# The video processor's own per-frame limits (transformers' Qwen2VLVideoProcessor defaults): a
# frame is never smaller than 128 merged patches, so every 2-frame group costs >= 128 tokens.
VIDEO_MIN_PIXELS = 128 * 28 * 28
VIDEO_MAX_PIXELS = 768 * 28 * 28

# (width, height) -> image tokens under the real Qwen2-VL rule.
EXPECTED_TOKENS = {(640, 480): 391, (224, 224): 64, (1920, 1080): 1222, (50, 50): 4}

SPECIAL_TOKENS = [
    "<|endoftext|>", "<|im_start|>", "<|im_end|>",
    "<|object_ref_start|>", "<|object_ref_end|>", "<|box_start|>", "<|box_end|>",
    "<|quad_start|>", "<|quad_end|>",
    "<|vision_start|>", "<|vision_end|>", "<|vision_pad|>", "<|image_pad|>", "<|video_pad|>",
]

# Qwen2-VL's conversation shape: a default system turn, <|im_start|>role ... <|im_end|>, and each
# image part rendered as <|vision_start|><|image_pad|><|vision_end|> where it appears.
CHAT_TEMPLATE = (
    "{% set image_count = namespace(value=0) %}"
    "{% if messages and messages[0]['role'] != 'system' %}"
    "<|im_start|>system\nYou are a helpful assistant.<|im_end|>\n"
    "{% endif %}"
    "{% for message in messages %}"
    "<|im_start|>{{ message['role'] }}\n"
    "{% if message['content'] is string %}"
    "{{ message['content'] }}"
    "{% else %}"
    "{% for part in message['content'] %}"
    "{% if part['type'] == 'text' %}"
    "{{ part['text'] }}"
    "{% elif part['type'] in ('image', 'image_url') or 'image' in part or 'image_url' in part %}"
    "{% set image_count.value = image_count.value + 1 %}"
    "<|vision_start|><|image_pad|><|vision_end|>"
    "{% elif part['type'] in ('video', 'video_url') %}"
    "<|vision_start|><|video_pad|><|vision_end|>"
    "{% endif %}"
    "{% endfor %}"
    "{% endif %}"
    "<|im_end|>\n"
    "{% endfor %}"
    "{% if add_generation_prompt %}"
    "<|im_start|>assistant\n"
    "{% endif %}"
)


def smart_resize(height: int, width: int, factor: int = PATCH * MERGE,
                 min_pixels: int = MIN_PIXELS, max_pixels: int = MAX_PIXELS) -> tuple[int, int]:
    """Qwen2-VL's resize rule (sides multiples of ``factor``, area within the limits)."""
    h = round(height / factor) * factor
    w = round(width / factor) * factor
    if h * w > max_pixels:
        beta = math.sqrt(height * width / max_pixels)
        h = max(factor, math.floor(height / beta / factor) * factor)
        w = max(factor, math.floor(width / beta / factor) * factor)
    elif h * w < min_pixels:
        beta = math.sqrt(min_pixels / (height * width))
        h = math.ceil(height * beta / factor) * factor
        w = math.ceil(width * beta / factor) * factor
    return h, w


def formula_tokens(width: int, height: int) -> int:
    h, w = smart_resize(height, width)
    return (h // PATCH) * (w // PATCH) // (MERGE * MERGE)


def _corpus(seed: int, lines: int = 4000) -> list[str]:
    """Seeded synthetic English-ish text for the tokenizer trainer (no downloads)."""
    rng = random.Random(seed)
    syllables = ["ka", "lo", "mi", "ta", "re", "su", "no", "vi", "da", "pe", "an", "or", "el", "is",
                 "the", "ing", "ed", "er", "st", "th", "qu", "ch"]
    words = ["".join(rng.choice(syllables) for _ in range(rng.randint(1, 4))) for _ in range(1500)]
    words += ["image", "describe", "picture", "what", "is", "in", "this", "the", "a", "of", "and"]
    out = []
    for _ in range(lines):
        n = rng.randint(4, 16)
        sentence = " ".join(rng.choice(words) for _ in range(n))
        out.append(sentence.capitalize() + rng.choice([".", "?", "!", ","]))
    out.append("0123456789 ()[]{}<>:;'\"-_+=*/\\|@#$%^&~`")
    return out


def build_tokenizer(seed: int, vocab_size: int = 1024):
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors, trainers
    from transformers import PreTrainedTokenizerFast

    tok = Tokenizer(models.BPE(unk_token=None))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    tok.post_processor = processors.ByteLevel(trim_offsets=False)
    # Alphabet = the bytes of the (printable ASCII) corpus only, not all 256: every token then
    # decodes to text on its own, so a random model's first output token is never a lone
    # partial UTF-8 byte that the server holds back as "no content yet".
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size, min_frequency=2, show_progress=False, special_tokens=[],
    )
    tok.train_from_iterator(_corpus(seed), trainer=trainer)
    fast = PreTrainedTokenizerFast(
        tokenizer_object=tok, eos_token="<|im_end|>", pad_token="<|endoftext|>",
        unk_token=None, model_max_length=32768, clean_up_tokenization_spaces=False,
    )
    fast.add_special_tokens({"additional_special_tokens": SPECIAL_TOKENS})
    fast.chat_template = CHAT_TEMPLATE
    return fast


def build(output: Path, seed: int) -> dict:
    import torch
    from transformers import (
        GenerationConfig,
        Qwen2VLConfig,
        Qwen2VLForConditionalGeneration,
        Qwen2VLImageProcessor,
        Qwen2VLProcessor,
        Qwen2VLVideoProcessor,
    )

    tokenizer = build_tokenizer(seed)
    ids = {t: tokenizer.convert_tokens_to_ids(t) for t in SPECIAL_TOKENS}
    vocab = len(tokenizer)  # every id the model can emit decodes to text
    text = {
        "vocab_size": vocab, "hidden_size": 128, "intermediate_size": 256,
        "num_hidden_layers": 1, "num_attention_heads": 2, "num_key_value_heads": 1,
        "max_position_embeddings": 32768, "rms_norm_eps": 1e-6, "hidden_act": "silu",
        "bos_token_id": ids["<|endoftext|>"], "eos_token_id": ids["<|im_end|>"],
        "pad_token_id": ids["<|endoftext|>"],
        # head dim 64: mrope sections (temporal, height, width) sum to half of it
        "rope_parameters": {"rope_type": "default", "rope_theta": 1000000.0,
                            "mrope_section": [8, 12, 12]},
    }
    vision = {"depth": 1, "embed_dim": 64, "num_heads": 2, "mlp_ratio": 2, "hidden_size": 128,
              "in_channels": 3, "patch_size": PATCH, "spatial_merge_size": MERGE,
              "temporal_patch_size": TEMPORAL}
    config = Qwen2VLConfig(
        text_config=text, vision_config=vision,
        image_token_id=ids["<|image_pad|>"], video_token_id=ids["<|video_pad|>"],
        vision_start_token_id=ids["<|vision_start|>"], vision_end_token_id=ids["<|vision_end|>"],
        tie_word_embeddings=False,
    )
    config.dtype = "bfloat16"
    torch.manual_seed(seed)
    model = Qwen2VLForConditionalGeneration(config)
    with torch.no_grad():  # every tensor seeded explicitly, independent of init order
        gen = torch.Generator().manual_seed(seed)
        for name, p in sorted(model.named_parameters(), key=lambda kv: kv[0]):
            if p.dim() >= 2:
                p.copy_(torch.randn(p.shape, generator=gen) * 0.02)
            elif "norm" in name:
                p.fill_(1.0)
            else:
                p.zero_()
    model = model.to(torch.bfloat16)
    model.generation_config = GenerationConfig(
        bos_token_id=ids["<|endoftext|>"], eos_token_id=[ids["<|im_end|>"], ids["<|endoftext|>"]],
        pad_token_id=ids["<|endoftext|>"], do_sample=False,
    )

    image_processor = Qwen2VLImageProcessor(min_pixels=MIN_PIXELS, max_pixels=MAX_PIXELS,
                                            patch_size=PATCH, temporal_patch_size=TEMPORAL,
                                            merge_size=MERGE)
    video_processor = Qwen2VLVideoProcessor(
        patch_size=PATCH, temporal_patch_size=TEMPORAL, merge_size=MERGE,
        size={"shortest_edge": VIDEO_MIN_PIXELS, "longest_edge": VIDEO_MAX_PIXELS})
    processor = Qwen2VLProcessor(image_processor=image_processor, tokenizer=tokenizer,
                                 video_processor=video_processor, chat_template=CHAT_TEMPLATE)

    tmp = output.with_name(output.name + ".tmp")
    if tmp.exists():
        shutil.rmtree(tmp)
    tmp.mkdir(parents=True)
    model.save_pretrained(tmp, safe_serialization=True)
    processor.save_pretrained(tmp)
    tokenizer.save_pretrained(tmp)
    counts = check_geometry(tmp)
    params = sum(p.numel() for p in model.parameters())
    info = {"recipe": RECIPE, "seed": seed, "parameters": params, "vocab": vocab,
            "image_tokens": {f"{w}x{h}": n for (w, h), n in counts.items()},
            "token_ids": {k: ids[k] for k in ("<|image_pad|>", "<|vision_start|>", "<|vision_end|>",
                                              "<|im_end|>")}}
    (tmp / STAMP).write_text(json.dumps({"recipe": RECIPE, "seed": seed}, sort_keys=True))
    if output.exists():
        shutil.rmtree(output)
    os.replace(tmp, output)
    return info


def check_geometry(folder: Path) -> dict:
    """Image tokens from the saved processor == the Qwen2-VL formula == the known values."""
    from PIL import Image
    from transformers import AutoProcessor

    processor = AutoProcessor.from_pretrained(folder)
    merge = processor.image_processor.merge_size ** 2
    counts = {}
    for (w, h), expected in EXPECTED_TOKENS.items():
        img = Image.new("RGB", (w, h), (90, 120, 150))
        out = processor.image_processor(images=[img], return_tensors="pt")
        got = int(out["image_grid_thw"][0].prod()) // merge
        if got != expected or formula_tokens(w, h) != expected:
            raise SystemExit(f"error: {w}x{h} gives {got} image tokens (formula "
                             f"{formula_tokens(w, h)}), expected {expected}")
        counts[(w, h)] = got
    msgs = [{"role": "user", "content": [{"type": "text", "text": "Describe."},
                                         {"type": "image"}]}]
    size = processor.video_processor.size
    if (size.shortest_edge, size.longest_edge) != (VIDEO_MIN_PIXELS, VIDEO_MAX_PIXELS):
        raise SystemExit(f"error: the video processor's pixel limits are {size}")
    prompt = processor.apply_chat_template(msgs, add_generation_prompt=True, tokenize=False)
    if prompt.count("<|image_pad|>") != 1 or not prompt.endswith("<|im_start|>assistant\n"):
        raise SystemExit(f"error: chat template renders {prompt!r}")
    return counts


def is_built(output: Path, seed: int) -> bool:
    try:
        stamp = json.loads((output / STAMP).read_text())
    except (OSError, ValueError):
        return False
    return stamp == {"recipe": RECIPE, "seed": seed}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--output", type=Path, required=True)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--force", action="store_true", help="rebuild even when the stamp matches")
    args = parser.parse_args(argv)
    if not args.force and is_built(args.output, args.seed):
        print(json.dumps({"reused": str(args.output)}))
        return 0
    info = build(args.output, args.seed)
    print(json.dumps(info))
    return 0


if __name__ == "__main__":
    sys.exit(main())
