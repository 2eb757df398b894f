"""Request text: an instruction plus filler prose, exactly N tokens under a chosen tokenizer.

Each row's text is a pure function of (seed, text key); the count is checked by re-tokenising
the final string, so it holds for the tokenizer the server uses, not an estimate.
"""
from __future__ import annotations

import threading
from functools import lru_cache
from pathlib import Path
from typing import Any

import numpy as np

from .. import rng
from ..errors import SpecError, UserError
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


def faker_word_list() -> tuple[str, ...]:
    """Faker's English word list (``faker.providers.lorem.en_US.Provider.word_list``), read from
    its source file: importing any module of faker runs the package's ``__init__``, which loads
    every provider of every locale (about 0.2 s of each process that writes text). Imported the
    ordinary way when the file no longer spells the list as one literal of that class."""
    import importlib.util

    spec = importlib.util.find_spec("faker")
    if spec is not None and spec.origin is not None:
        source = Path(spec.origin).parent / "providers" / "lorem" / "en_US" / "__init__.py"
        words = _class_literal(source, "Provider", "word_list")
        if isinstance(words, (tuple, list)):
            return tuple(words)
    from faker.providers.lorem.en_US import Provider

    return tuple(Provider.word_list)


def _class_literal(path: Path, cls: str, name: str) -> Any:
    """The literal value assigned to ``name`` in the body of class ``cls`` of a Python source
    file; None when there is no such assignment of a literal."""
    import ast

    try:
        tree = ast.parse(path.read_bytes())
    except (OSError, SyntaxError, ValueError):
        return None
    values = [n.value for c in tree.body if isinstance(c, ast.ClassDef) and c.name == cls
              for n in c.body if isinstance(n, ast.Assign)
              and [getattr(t, "id", None) for t in n.targets] == [name]]
    try:
        return ast.literal_eval(values[0]) if values else None
    except ValueError:
        return None


@lru_cache(maxsize=1)
def sentence_bank() -> tuple[str, ...]:
    """Fixed filler sentences built from Faker's English word list (same for every seed)."""
    words = np.array(faker_word_list(), dtype=object)
    g = np.random.default_rng(0xBA4C)
    lengths = g.integers(6, 19, BANK_SIZE)
    picks = words[g.integers(0, len(words), int(lengths.sum()))]
    ends = np.where(g.random(BANK_SIZE) < 0.08, "?", ".")
    out, pos = [], 0
    for n, end in zip(lengths.tolist(), ends.tolist()):
        out.append(" ".join(picks[pos:pos + n]).capitalize() + end)
        pos += n
    return tuple(out)


class TextEngine:
    """Makes row texts of exactly ``tokens`` tokens, optionally after a shared prefix."""

    def __init__(self, tokenizer: Tokenizer, tokens: int, seed: int, prefix_tokens: int = 0) -> None:
        if tokens < 0:
            raise SpecError("text_tokens", f"must be zero or positive, got {tokens}")
        if not 0 <= prefix_tokens <= tokens:
            raise SpecError("shared_prefix_tokens", f"must be in 0..{tokens} (the text length)")
        self.tok, self.tokens, self.seed = tokenizer, tokens, seed
        self.prefix_tokens = prefix_tokens
        self._prefix: str | None = None
        self._lock = threading.Lock()

    @property
    def prefix(self) -> str:
        """The shared opening of every text (computed on first use: tokenizers load lazily)."""
        with self._lock:  # rows render in several threads
            if self._prefix is None:
                self._prefix = self._fit(rng.rng_for(self.seed, rng.TEXT, 1 << 62), "",
                                         "Shared context:", self.prefix_tokens) if self.prefix_tokens else ""
        return self._prefix

    def _fit(self, g: np.random.Generator, head: str, opening: str, tokens: int) -> str:
        """``head`` plus prose cut to exactly ``tokens`` tokens in all."""
        for attempt in range(1, MAX_ATTEMPTS + 1):
            ids = self.tok.encode(head + self._prose(g, tokens * attempt, opening))
            if len(ids) >= tokens:
                return self._exact(ids, tokens)
        raise UserError(f"could not build {tokens} tokens of text with {self.tok.name}")

    def _prose(self, g: np.random.Generator, tokens: int, opening: str) -> str:
        """At least ``tokens`` tokens of prose (by a conservative estimate)."""
        bank = sentence_bank()
        parts = [opening]
        # ~15 tokens per bank sentence: aim ~15 % high; callers retry with more when short
        n = max(2, tokens // 13 + 4)
        parts.extend(bank[i] for i in g.integers(0, len(bank), n))
        return " ".join(parts)

    def _exact(self, ids: list, tokens: int) -> str:
        """Token ids cut to a text of exactly ``tokens`` tokens (verified by re-tokenising)."""
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
        head = self.prefix + "\n\n" if self.prefix else ""
        return self._fit(g, head, opening, self.tokens)
