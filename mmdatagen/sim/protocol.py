"""OpenAI wire format for the simulator: request parsing/validation and response bytes.

Prompt text tokens are APPROXIMATE: UTF-8 bytes / ``text_bytes_per_token`` (profile, default 4),
rounded up per text. Image prompt tokens come from the model registry (``vlm.py``).
"""
from __future__ import annotations

import math
import time
from dataclasses import dataclass
from typing import Any

import orjson

from ..caches.entries import entry_size
from ..errors import DatasetError, UserError
from ..io.imageref import ImageIdentifier
from ..vlm import VisionModel
from .engine import SimImage
from .errors import RequestError
from .media import MEDIA_PARTS, media_part
from .profile import Profile

# Each simulated token is one of these words (one token each in common BPE vocabularies).
WORDS = (" This", " is", " a", " simulated", " response", " from", " a", " performance",
         " model", ",", " not", " a", " language", " model", ".")
_WORD_JSON = tuple(orjson.dumps(w) for w in WORDS)
NOTICE = "mmdatagen simulator: a performance model, not a language model"


@dataclass
class ParsedRequest:
    kind: str  # "chat" | "completions"
    model: str
    stream: bool
    include_usage: bool
    text_tokens: int
    images: list[SimImage]
    target_tokens: int
    finish_reason: str

    @property
    def prompt_tokens(self) -> int:
        return self.text_tokens + sum(im.prompt_tokens for im in self.images)


class ImageResolver:
    """Turns image references into :class:`SimImage`: identity and entry size come from the
    services the analysis and the loader's prediction use (``io/imageref``,
    ``caches/entries``), under the profile's cache target; errors become 400 answers. Local
    paths are refused (an HTTP server only sees data URLs and http(s) URLs) unless
    ``allow_paths`` (virtual runs)."""

    def __init__(self, model: VisionModel, profile: Profile, allow_paths: bool = False,
                 dataset_dir=None) -> None:
        self.model, self.p = model, profile
        self.target = profile.cache_target()
        self.mode = self.target.key
        self.allow_paths = allow_paths
        self.identify = ImageIdentifier(self.mode, dataset_dir, memo_size=8192)
        self._sizes: dict[tuple[int, int], tuple[int, int, int]] = {}

    def _sized(self, w: int, h: int) -> tuple[int, int, int]:
        hit = self._sizes.get((w, h))
        if hit is None:
            m = self.model
            try:
                hit = (m.image_tokens(w, h), m.prompt_tokens(w, h),
                       entry_size(self.target, m, w, h))
            except UserError as exc:
                raise RequestError(400, f"image rejected: {exc}") from None
            self._sizes[(w, h)] = hit
        return hit

    def resolve(self, url: str, uuid: str | None) -> SimImage:
        if url.startswith("data:"):
            head = url[:url.find(",")] if "," in url else url[:64]
            if ";base64" not in head:
                raise RequestError(400, "image data URLs must be base64-encoded")
            if not head[5:].startswith("image/"):
                raise RequestError(400, f"unsupported media type in data URL: {head[5:40]!r}")
        elif url and not url.startswith(("http://", "https://")) and not self.allow_paths:
            raise RequestError(400, "image_url.url must be a data: URL or an http(s) URL")
        if not url and not uuid:
            raise RequestError(400, "image_url.url is empty and no uuid was given")
        try:
            ident = self.identify(url, uuid)
        except DatasetError as exc:
            raise RequestError(400, f"invalid image: {exc}") from None
        except Exception as exc:
            raise RequestError(400, f"invalid image: {type(exc).__name__}") from None
        w, h = (ident.width, ident.height) if ident.width > 0 else self.p.default_image_size
        tokens, prompt, nbytes = self._sized(w, h)
        return SimImage(ident.key, tokens, prompt, nbytes, ident.remote, w * h)


def _text_tokens(text: str, bytes_per_token: float) -> int:
    return math.ceil(len(text.encode()) / bytes_per_token) if text else 0


def _int_field(body: dict, name: str, minimum: int) -> int | None:
    v = body.get(name)
    if v is None:
        return None
    if isinstance(v, bool) or not isinstance(v, int) or v < minimum:
        raise RequestError(400, f"'{name}' must be an integer >= {minimum}")
    return v


# Message roles the OpenAI chat API (and vLLM) accept; content is optional only for assistant
# messages (which may carry tool calls instead).
ROLES = frozenset({"system", "developer", "user", "assistant", "tool", "function"})
# Sampling parameters: (lowest, highest, lowest included) as vLLM's SamplingParams checks them.
_NUMBERS = {"temperature": (0.0, math.inf, True), "top_p": (0.0, 1.0, False),
            "min_p": (0.0, 1.0, True), "presence_penalty": (-2.0, 2.0, True),
            "frequency_penalty": (-2.0, 2.0, True), "repetition_penalty": (0.0, math.inf, False)}
_INTEGERS = ("seed", "top_k", "top_logprobs")
_BOOLEANS = ("logprobs", "echo", "add_generation_prompt", "skip_special_tokens")


def _load_json(raw: bytes) -> dict:
    try:
        body = orjson.loads(raw)
    except orjson.JSONDecodeError as exc:
        raise RequestError(400, f"request body is not valid JSON: {exc.msg}") from None
    if not isinstance(body, dict):
        raise RequestError(400, "request body must be a JSON object")
    return body


def _check_model(body: dict, models: frozenset[str]) -> str:
    model = body.get("model")
    if not isinstance(model, str) or not model:
        raise RequestError(400, "missing required field 'model'")
    if model not in models:
        raise RequestError(404, f"The model `{model}` does not exist.", "NotFoundError",
                           "model_not_found")
    return model


def _check_number(body: dict, name: str, low: float, high: float, low_ok: bool) -> None:
    v = body.get(name)
    if v is None:
        return
    if isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v):
        raise RequestError(400, f"'{name}' must be a number")
    if v < low or (v == low and not low_ok) or v > high:
        bound = "[" if low_ok else "("
        raise RequestError(400, f"'{name}' must be in {bound}{low:g}, {high:g}], got {v!r}")


def _check_type(body: dict, names: tuple[str, ...], ok, what: str) -> None:
    for name in names:
        v = body.get(name)
        if v is not None and not ok(v):
            raise RequestError(400, f"'{name}' must be {what}")


def _is_int(v: Any) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)


def _is_stop(v: Any) -> bool:
    return isinstance(v, str) or (isinstance(v, list) and all(isinstance(x, str) for x in v))


def _check_sampling(body: dict) -> None:
    """Types and ranges of the sampling fields (the simulator ignores their values)."""
    for name, (low, high, low_ok) in _NUMBERS.items():
        _check_number(body, name, low, high, low_ok)
    _check_type(body, _INTEGERS, _is_int, "an integer")
    _check_type(body, _BOOLEANS, lambda v: isinstance(v, bool), "a boolean")
    _check_type(body, ("stop",), _is_stop, "a string or a list of strings")


def _part(part: Any, bpt: float, resolver: ImageResolver, images: list[SimImage]) -> int:
    """One content part: its text tokens (images are appended to ``images``)."""
    if not isinstance(part, dict):
        raise RequestError(400, "content parts must be objects")
    ptype = part.get("type")
    if ptype == "text":
        text = part.get("text")
        if not isinstance(text, str):
            raise RequestError(400, "text parts need a string 'text'")
        return _text_tokens(text, bpt)
    if ptype == "image_url":
        iu = part.get("image_url")
        if not isinstance(iu, dict):
            raise RequestError(400, "'image_url' must be an object {\"url\": ...}")
        url, uuid = iu.get("url"), part.get("uuid")
        if not isinstance(url, str) or (uuid is not None and not isinstance(uuid, str)):
            raise RequestError(400, "image_url parts need a string 'url'")
        images.append(resolver.resolve(url, uuid))
        return 0
    if ptype in MEDIA_PARTS:  # video_url, input_audio: sim/media.py
        images.append(media_part(part, ptype, resolver))
        return 0
    raise RequestError(400, f"unsupported content part type {ptype!r}")


def _message(msg: Any, bpt: float, resolver: ImageResolver, images: list[SimImage]) -> int:
    """One chat message: its text tokens."""
    if not isinstance(msg, dict) or not isinstance(msg.get("role"), str):
        raise RequestError(400, "each message must be an object with a 'role'")
    role = msg["role"]
    if role not in ROLES:
        raise RequestError(400, f"unknown message role {role[:40]!r}; expected one of "
                                f"{', '.join(sorted(ROLES))}")
    if "content" not in msg:
        if role == "assistant":
            return 0
        raise RequestError(400, f"a '{role}' message needs 'content'")
    content = msg["content"]
    if content is None and role == "assistant":
        return 0
    if isinstance(content, str):
        return _text_tokens(content, bpt)
    if not isinstance(content, list):
        raise RequestError(400, "message 'content' must be a string or a list of parts")
    return sum(_part(part, bpt, resolver, images) for part in content)


def _chat_prompt(body: dict, bpt: float, resolver: ImageResolver) -> tuple[int, list[SimImage]]:
    messages = body.get("messages")
    if not isinstance(messages, list) or not messages:
        raise RequestError(400, "'messages' must be a non-empty list")
    images: list[SimImage] = []
    return sum(_message(m, bpt, resolver, images) for m in messages), images


def _completion_prompt(body: dict, bpt: float) -> int:
    prompt = body.get("prompt")
    if isinstance(prompt, str):
        return _text_tokens(prompt, bpt)
    if isinstance(prompt, list) and prompt and all(isinstance(x, str) for x in prompt):
        if len(prompt) > 1:
            raise RequestError(400, "the simulator accepts one prompt per request")
        return _text_tokens(prompt[0], bpt)
    if (isinstance(prompt, list) and prompt
            and all(isinstance(x, int) and not isinstance(x, bool) for x in prompt)):
        return len(prompt)
    raise RequestError(400, "'prompt' must be a string, one-string list or token ids")


def _stream_flags(body: dict) -> tuple[bool, bool]:
    stream = body.get("stream", False)
    if not isinstance(stream, bool):
        raise RequestError(400, "'stream' must be a boolean")
    opts = body.get("stream_options")
    if opts is not None and not isinstance(opts, dict):
        raise RequestError(400, "'stream_options' must be an object")
    return stream, bool(opts and opts.get("include_usage")) and stream


def _output_request(body: dict) -> tuple[int | None, int, bool]:
    """``max_tokens`` (or ``max_completion_tokens``), ``min_tokens``, ``ignore_eos``."""
    n = body.get("n", 1)
    if n != 1:
        raise RequestError(400, "the simulator supports n = 1 only")
    max_tokens = _int_field(body, "max_completion_tokens", 1)
    if max_tokens is None:
        max_tokens = _int_field(body, "max_tokens", 1)
    min_tokens = _int_field(body, "min_tokens", 0) or 0
    ignore_eos = body.get("ignore_eos", False)
    if not isinstance(ignore_eos, bool):
        raise RequestError(400, "'ignore_eos' must be a boolean")
    return max_tokens, min_tokens, ignore_eos


def output_target(natural: int, max_tokens: int | None, min_tokens: int = 0,
                  ignore_eos: bool = False) -> tuple[int, str]:
    """Tokens a request generates and its finish reason: THE rule of ``serve`` and ``simulate``.

    Without ``ignore_eos`` the model stops at its natural length (the profile's) unless
    ``max_tokens`` cuts it; ``min_tokens`` is a floor either way.
    """
    if max_tokens is not None and min_tokens > max_tokens:
        raise RequestError(400, "'min_tokens' must not exceed 'max_tokens'")
    if ignore_eos:
        target = max_tokens if max_tokens is not None else natural
    else:
        target = natural if max_tokens is None else min(max_tokens, natural)
    target = max(target, min_tokens, 1)
    return target, "length" if max_tokens is not None and target >= max_tokens else "stop"


def check_context(profile: Profile, prompt_tokens: int, target: int,
                  max_tokens: int | None) -> None:
    """The prompt plus the output asked for must fit the model's context (as vLLM checks)."""
    asked = max(target, max_tokens or 0)
    if prompt_tokens + asked > profile.max_model_len:
        raise RequestError(400, f"prompt ({prompt_tokens} tokens) plus output ({asked}) "
                                f"exceeds the maximum context length {profile.max_model_len}")


def parse_body(raw: bytes, kind: str, profile: Profile, resolver: ImageResolver,
               models: frozenset[str]) -> ParsedRequest:
    """Validate an OpenAI request body; raise :class:`RequestError` on anything unusable."""
    body = _load_json(raw)
    model = _check_model(body, models)
    bpt = profile.text_bytes_per_token
    if kind == "chat":
        text_tokens, images = _chat_prompt(body, bpt, resolver)
    else:
        text_tokens, images = _completion_prompt(body, bpt), []
    _check_sampling(body)
    stream, include_usage = _stream_flags(body)
    max_tokens, min_tokens, ignore_eos = _output_request(body)
    target, finish = output_target(profile.natural_output_tokens, max_tokens, min_tokens,
                                   ignore_eos)
    parsed = ParsedRequest(kind, model, stream, include_usage, text_tokens, images, target, finish)
    check_context(profile, parsed.prompt_tokens, target, max_tokens)
    return parsed


class Responder:
    """Pre-serialised response pieces for one request (streaming chunks and final bodies)."""

    __slots__ = ("_pre", "created", "model", "req", "rid")

    def __init__(self, req: ParsedRequest, rid: str) -> None:
        self.req, self.rid = req, rid
        self.created = int(time.time())
        self.model = req.model
        obj = "chat.completion.chunk" if req.kind == "chat" else "text_completion"
        self._pre = (b'data: {"id":"' + rid.encode() + b'","object":"' + obj.encode()
                     + b'","created":' + str(self.created).encode() + b',"model":'
                     + orjson.dumps(req.model) + b',"choices":[{"index":0,')

    def chunk(self, i: int, last: bool) -> bytes:
        """SSE event for token ``i`` (0-based)."""
        word = _WORD_JSON[i % len(_WORD_JSON)]
        fin = orjson.dumps(self.req.finish_reason) if last else b"null"
        if self.req.kind == "chat":
            delta = b'{"role":"assistant","content":' if i == 0 else b'{"content":'
            return self._pre + b'"delta":' + delta + word + b'},"logprobs":null,"finish_reason":' + fin + b"}]}\n\n"
        return self._pre + b'"text":' + word + b',"logprobs":null,"finish_reason":' + fin + b"}]}\n\n"

    def usage(self, completion: int) -> dict[str, int]:
        p = self.req.prompt_tokens
        return {"prompt_tokens": p, "completion_tokens": completion, "total_tokens": p + completion}

    def usage_chunk(self, completion: int) -> bytes:
        obj = "chat.completion.chunk" if self.req.kind == "chat" else "text_completion"
        return b"data: " + orjson.dumps({"id": self.rid, "object": obj, "created": self.created,
                                         "model": self.model, "choices": [],
                                         "usage": self.usage(completion)}) + b"\n\n"

    def full(self, completion: int) -> bytes:
        text = "".join(WORDS[i % len(WORDS)] for i in range(completion))
        if self.req.kind == "chat":
            choice: dict[str, Any] = {"index": 0, "message": {"role": "assistant", "content": text},
                                      "logprobs": None, "finish_reason": self.req.finish_reason}
            obj = "chat.completion"
        else:
            choice = {"index": 0, "text": text, "logprobs": None,
                      "finish_reason": self.req.finish_reason}
            obj = "text_completion"
        return orjson.dumps({"id": self.rid, "object": obj, "created": self.created,
                             "model": self.model, "choices": [choice],
                             "usage": self.usage(completion),
                             "system_fingerprint": "mmdatagen-sim"})


DONE = b"data: [DONE]\n\n"
