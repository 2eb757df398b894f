"""Request text: an instruction plus filler prose, exactly N tokens under a chosen tokenizer.

Each row's text is a pure function of (seed, text key); the count is checked by re-tokenising
the final string, so it holds for the tokenizer the server uses, not an estimate.
"""
from __future__ import annotations

from functools import lru_cache

import numpy as np

from .. import rng
from ..errors import UserError
from .tokenizers import Tokenizer

INSTRUCTIONS = (
    "Describe what you see in the image, paying attention to the {a} and the {b}.",
    "Look at the picture and explain how the {a} relates to the {b}.",
    "Write a short report about the {a} shown here, then list anything unusual about the {b}.",
    "Answer as an analyst: what does the image suggest about the {a}, and what about the {b}?",
    "Summarise the scene for a colleague who cares mostly about the {a}.",
    "Identify the main objects in the image and estimate the {a} of each.",
    "Compare the visual details with the notes below and point out any {a} they miss.",
    "Read the notes below, then tell me whether the image supports them regarding the {a}.",
)
SUBJECTS = ("lighting", "colours", "background", "foreground", "shapes", "layout", "textures",
            "objects", "edges", "contrast", "composition", "sky", "horizon", "shadows", "patterns",
            "symmetry", "scale", "perspective", "details", "mood")
BANK_SIZE = 4096
MAX_ATTEMPTS = 64


@lru_cache(maxsize=1)
def sentence_bank() -> tuple[str, ...]:
    """Fixed filler sentences built from Faker's English word list (same for every seed)."""
    from faker.providers.lorem.en_US import Provider

    words = Provider.word_list
    g = np.random.default_rng(0xBA4C)
    out = []
    for _ in range(BANK_SIZE):
        picks = [words[i] for i in g.integers(0, len(words), int(g.integers(6, 19)))]
        out.append(" ".join(picks).capitalize() + ("?" if g.random() < 0.08 else "."))
    return tuple(out)


class TextEngine:
    """Makes row texts of exactly ``tokens`` tokens, optionally after a shared prefix."""

    def __init__(self, tokenizer: Tokenizer, tokens: int, seed: int, prefix_tokens: int = 0) -> None:
        if tokens < 0:
            raise UserError(f"--text-tokens must be zero or positive, got {tokens}")
        if not 0 <= prefix_tokens <= tokens:
            raise UserError(f"--shared-prefix-tokens must be in 0..{tokens} (the text length)")
        self.tok, self.tokens, self.seed = tokenizer, tokens, seed
        self.prefix = self._exact(self._prose(rng.rng_for(seed, rng.TEXT, 1 << 62), prefix_tokens,
                                              "Shared context:"), prefix_tokens) if prefix_tokens else ""

    def _prose(self, g: np.random.Generator, tokens: int, opening: str) -> str:
        """At least ``tokens`` tokens of prose (by a conservative estimate)."""
        bank = sentence_bank()
        parts = [opening]
        # ~1.3 tokens per word, ~12 words per sentence: aim high, the exact cut comes later
        n = max(2, tokens // 10 + 4)
        parts.extend(bank[i] for i in g.integers(0, len(bank), n))
        return " ".join(parts)

    def _exact(self, text: str, tokens: int) -> str:
        """``text`` cut to exactly ``tokens`` tokens (verified by re-tokenising)."""
        ids = self.tok.encode(text)
        if len(ids) < tokens:
            raise AssertionError("prose shorter than asked")  # _prose over-provisions
        for delta in (0, -1, 1, -2, 2, -3, 3):
            cut = tokens + delta
            if 0 <= cut <= len(ids):
                candidate = self.tok.decode(ids[:cut])
                if len(self.tok.encode(candidate)) == tokens:
                    return candidate
        raise UserError(f"could not cut text to exactly {tokens} tokens with {self.tok.name}")

    def text(self, key: int) -> str:
        """The text for one text key (rows sharing a key share the text)."""
        if self.tokens == 0:
            return ""
        g = rng.rng_for(self.seed, rng.TEXT, key)
        a, b = (SUBJECTS[int(i)] for i in g.choice(len(SUBJECTS), 2, replace=False))
        opening = INSTRUCTIONS[int(g.integers(0, len(INSTRUCTIONS)))].format(a=a, b=b)
        sep = "\n\n" if self.prefix else ""
        for attempt in range(MAX_ATTEMPTS):
            body = self._prose(g, self.tokens * (attempt + 1), opening)
            full = self.prefix + sep + body
            if len(self.tok.encode(full)) >= self.tokens:
                return self._exact(full, self.tokens)
        raise UserError(f"could not build {self.tokens} tokens of text with {self.tok.name}")
