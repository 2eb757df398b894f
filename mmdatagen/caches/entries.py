"""What an image or a clip puts in an engine's cache, in the unit the target's capacity counts
(bytes of embeddings, bytes of processed pixels, or tokens), a request's items under a target,
and the cache model built for a target and a model (with the front tier's budget where the
target has one). The one implementation of these for the analysis, the simulator, the loader's
prediction and sweeps; image identity stays with the references (``io.imageref``)."""
from __future__ import annotations

from typing import TYPE_CHECKING

from ..media_tokens import encoder_cache_budget

if TYPE_CHECKING:
    from ..vlm import VisionModel
    from .targets import CacheTarget


def entry_size(target, model, width: int, height: int, real_width: bool = False) -> int:
    """One image's cache entry under ``target`` (a ``caches.CacheTarget``), in the unit its
    capacity counts: bytes of embeddings, bytes of processed pixel patches, or tokens."""
    if target.entry == "processor":
        return model.processor_bytes(width, height)
    if target.entry == "tokens":
        return model.image_tokens(width, height)
    return model.entry_bytes(width, height, real_width)


DEFAULT_BATCHED_TOKENS = 8192  # vLLM's max_num_batched_tokens for online serving on large GPUs


def front_budget(target, model, given: int | None = None,
                 max_num_batched_tokens: int = DEFAULT_BATCHED_TOKENS,
                 limit_mm_per_prompt: dict[str, int] | None = None,
                 max_model_len: int | None = None) -> int | None:
    """The budget in embedding tokens of the cache in front of ``target`` (vLLM's encoder cache
    before Dynamo's connector), or None for a target without one: ``given`` where the user read
    it from the engine's startup log, else vLLM 0.32's rule for ``model`` with these engine
    settings (``media_tokens.encoder_cache_budget``). Dynamo's connector is an EC consumer, so
    vLLM accepts pre-computed embeddings and every modality stays active whatever its limit
    (measured: 3,840 tokens, a video's, with ``{"image": 4, "video": 0}``)."""
    if target.front is None:
        return None
    if given is not None:
        return int(given)
    return encoder_cache_budget(model, max_num_batched_tokens, limit_mm_per_prompt,
                                max_model_len, mm_embeds=True)


def make_target_cache(target, model, capacity: int, front: int | None = None,
                      engine_faults: bool = False):
    """``caches.make_cache`` for ``target`` sized for ``model`` (``capacity`` in the entry unit;
    ``front``: the front tier's budget, None for vLLM's rule; ``engine_faults``: with the
    engine's own failures, for a prediction of a real engine)."""
    from .model import make_cache

    if target.front is None:
        return make_cache(target, capacity, engine_faults=engine_faults)
    return make_cache(target, capacity, front_tokens=front_budget(target, model, front),
                      bytes_per_token=model.bytes_per_token)


def request_items(target, keys: list, sizes: list[int]) -> list[tuple]:
    """A request's cache items under ``target``: one per image, or, for a cache keyed by the
    request's whole image set (SGLang), one item for the set."""
    if target.entry == "embedding-set":
        return [(("set", *keys), sum(sizes))] if keys else []
    return list(zip(keys, sizes))


def image_flags(target, item_flags: list[bool], num_images: int) -> list[bool]:
    """Per image, hit or miss, from the flags of :func:`request_items`' items (a set-keyed
    cache hits or misses every image of the request at once)."""
    if target.entry == "embedding-set":
        return [bool(item_flags and item_flags[0])] * num_images
    return list(item_flags)


def clip_entry_size(target: CacheTarget | None, model: VisionModel, tokens: int,
                    processor: int) -> int:
    """A video's or audio clip's cache entry in the unit ``target``'s capacity counts (no
    target: embedding bytes), from its encoder tokens and processor-cache bytes; the clips'
    counterpart of :func:`entry_size`."""
    entry = "embedding" if target is None else target.entry
    if entry == "processor":
        return processor
    if entry == "tokens":
        return tokens
    return tokens * model.bytes_per_token
