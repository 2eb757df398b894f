"""Video and audio content parts in the simulator: identity, tokens and cache entry size.

``parse_body`` hands ``video_url`` and ``input_audio`` parts here. Each item becomes a
:class:`SimImage` (the engine's unit of encoder work and cache entry), so the encoder is charged
per embedding token of every modality and one cache holds images, videos and audios, as vLLM's
encoder and processor caches do. Videos are sized with the model family's video rule
(``media_tokens``: frame sampling, temporal patches, pixel budgets); audio with Qwen2-Audio's
rule (the simulated profiles are vision-language models; their audio cost is an assumption).
Keys: the decoded bytes' blake3 (vLLM hashes media bytes), the reference for the "reference"
key mode, the uuid for "uuid" mode when one is given.
"""
from __future__ import annotations

import base64
from pathlib import Path
from typing import Any

import blake3

from ..errors import DatasetError
from ..io.mediaref import audio_info, decode_b64, decode_video_url, video_info
from ..media_tokens import QWEN2_AUDIO, audio_processor_bytes, audio_tokens, video_cost, \
    video_geometry

MEDIA_PARTS = ("video_url", "input_audio")
REMOTE_VIDEO = (16, 2.0, 640, 360)  # frames, fps, width, height assumed for http(s) videos


class MediaResolver:
    """Video/audio parts -> SimImage, memoised by content hash."""

    def __init__(self, model, target, error: type[Exception], memo_size: int = 4096,
                 dataset_dir: Path | None = None) -> None:
        self.model, self.target, self.error = model, target, error
        self.dataset_dir = dataset_dir  # local files allowed (virtual runs) when set
        self.geom = video_geometry(model.family, model.patch_size, model.merge_size,
                                   model.temporal_patch_size, model.min_pixels, model.max_pixels) \
            if model.tokens_per_image is None else None
        self._memo: dict[Any, tuple[int, int, int]] = {}
        self._strings: dict[bytes, tuple[tuple, tuple[int, int, int]]] = {}  # by reference hash
        self._memo_size = memo_size

    def _size(self, tokens: int, prompt: int, processor: int) -> tuple[int, int, int]:
        entry = self.target.entry
        if entry == "processor":
            nbytes = processor
        elif entry == "tokens":
            nbytes = tokens
        else:
            nbytes = tokens * self.model.bytes_per_token
        return tokens, prompt, nbytes

    def _key(self, content_key: tuple, ref: str, uuid: str | None) -> tuple:
        mode = self.target.key
        if mode == "uuid" and uuid:
            return ("uuid", uuid)
        if mode == "reference" and ref:
            return ("ref", ref)
        return content_key

    def video(self, part: dict, sim_image) -> Any:
        vu = part.get("video_url")
        url = vu.get("url") if isinstance(vu, dict) else vu
        uuid = part.get("uuid")
        if not isinstance(url, str) or not url or (uuid is not None and not isinstance(uuid, str)):
            raise self.error(400, "video_url parts need a non-empty string 'url'")
        if self.geom is None:
            raise self.error(400, f"model {self.model.name} has no video geometry")
        remote = url.startswith(("http://", "https://"))
        seen = self._strings.get(blake3.blake3(url.encode()).digest())
        if seen is not None:  # the same reference string again: no base64 decoding, no hashing
            return sim_image(self._key(seen[0], url, uuid), *seen[1], remote)
        if remote:
            key, info = ("ref", url), REMOTE_VIDEO
        elif url.startswith("data:video/") or (self.dataset_dir is not None and "://" not in url):
            try:
                data = decode_video_url(url) if url.startswith("data:") else \
                    _read(url, self.dataset_dir)
            except DatasetError as exc:
                raise self.error(400, f"invalid video: {exc}") from None
            key = ("video", blake3.blake3(data).hexdigest())
            info = None
        else:
            raise self.error(400, "video_url.url must be a data:video/ URL or an http(s) URL")
        sized = self._memo.get(key)
        if sized is None:
            if info is None:
                try:
                    v = video_info(data)
                except DatasetError as exc:
                    raise self.error(400, f"invalid video: {exc}") from None
                info = (v.frames, v.fps, v.width, v.height)
            frames, fps, w, h = info
            try:
                cost = video_cost(self.geom, frames, fps, w, h)
            except ValueError as exc:
                raise self.error(400, f"video rejected: {exc}") from None
            sized = self._size(cost.tokens, cost.prompt_tokens, cost.processor_bytes)
            self._remember(key, sized)
        if not remote and "://" not in url and not url.startswith("data:"):
            return sim_image(self._key(key, url, uuid), *sized, remote)  # files may change
        self._remember_string(url, key, sized)
        return sim_image(self._key(key, url, uuid), *sized, remote)

    def audio(self, part: dict, sim_image) -> Any:
        ia = part.get("input_audio")
        if not isinstance(ia, dict) or not isinstance(ia.get("data"), str) \
                or not isinstance(ia.get("format"), str):
            raise self.error(400, "input_audio parts need string 'data' and 'format'")
        fmt = ia["format"].lower()
        seen = self._strings.get(blake3.blake3((fmt + "," + ia["data"]).encode()).digest())
        if seen is not None:
            return sim_image(self._key(seen[0], "", part.get("uuid")), *seen[1], False)
        try:
            data = decode_b64(ia["data"], "input_audio.data")
            key = ("audio", blake3.blake3(data).hexdigest())
            sized = self._memo.get(key)
            if sized is None:
                a = audio_info(data, fmt)
                tokens = audio_tokens(QWEN2_AUDIO, a.samples, a.sample_rate)
                sized = self._size(tokens, tokens + QWEN2_AUDIO.marker_tokens,
                                   audio_processor_bytes(QWEN2_AUDIO, a.samples, a.sample_rate))
                self._remember(key, sized)
        except DatasetError as exc:
            raise self.error(400, f"invalid audio: {exc}") from None
        self._remember_string(fmt + "," + ia["data"], key, sized)
        return sim_image(self._key(key, "", part.get("uuid")), *sized, False)

    def _remember(self, key: tuple, sized: tuple[int, int, int]) -> None:
        if len(self._memo) >= self._memo_size:
            self._memo.clear()
        self._memo[key] = sized

    def _remember_string(self, text: str, key: tuple, sized: tuple[int, int, int]) -> None:
        if len(self._strings) >= self._memo_size:
            self._strings.clear()
        self._strings[blake3.blake3(text.encode()).digest()] = (key, sized)


def media_part(part: dict, ptype: str, resolver) -> Any:
    """One ``video_url`` / ``input_audio`` part as a SimImage (``resolver``: the request's
    ImageResolver, whose model and cache target size it)."""
    from .engine import SimImage
    from .protocol import RequestError

    media = getattr(resolver, "_media", None)
    if media is None:
        folder = Path(resolver.identify.dir or ".") if resolver.allow_paths else None
        media = resolver._media = MediaResolver(resolver.model, resolver.target, RequestError,
                                                dataset_dir=folder)
    if ptype == "video_url":
        return media.video(part, SimImage)
    return media.audio(part, SimImage)


def turn_media(turn, resolver) -> list:
    """A dataset turn's videos and audios as SimImages (virtual runs read local files)."""
    from .protocol import RequestError

    out = []
    for ref in turn.audios:
        if not ref:
            continue
        if ref[:4].lower() in ("wav,", "mp3,"):
            fmt, _, data = ref.partition(",")
        elif "://" in ref or ref.startswith("data:"):
            raise RequestError(400, "audio must be inline (wav,<base64>) or a local file")
        else:
            folder = resolver.identify.dir if resolver.allow_paths else None
            raw = _read(ref, Path(folder or "."))
            fmt, data = Path(ref).suffix.lower().lstrip("."), base64.b64encode(raw).decode()
        out.append(media_part({"type": "input_audio", "input_audio": {"data": data, "format": fmt}},
                              "input_audio", resolver))
    for ref in turn.videos:
        if ref:
            out.append(media_part({"type": "video_url", "video_url": {"url": ref}}, "video_url",
                                  resolver))
    return out


def _read(ref: str, folder: Path) -> bytes:
    path = Path(ref) if Path(ref).is_absolute() else folder / ref
    try:
        return path.read_bytes()
    except OSError as exc:
        raise DatasetError(f"cannot read {path}: {exc.strerror}") from None
