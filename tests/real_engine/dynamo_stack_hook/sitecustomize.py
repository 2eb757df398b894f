"""Run Dynamo's embedding-cache connector on a CPU-only engine (the real-engine suite only).

Dynamo's vLLM worker wires ``DynamoMultimodalEmbeddingCacheConnector`` itself, and the connector
moves every loaded embedding to the device ``_get_device`` names: ``"cuda"`` unless vLLM's device
is CUDA or XPU. On the CPU engine that is wrong (the worker dies on the first cache hit with
"Torch not compiled with CUDA enabled"). This file, put first on ``PYTHONPATH`` by
``tests/real_engine/dynamo_stack.py``, is imported by ``site`` at every interpreter start (the
worker, vLLM's engine-core process, the frontend); it wraps the loader of that one module so that,
after the module runs, its ``_get_device`` answers ``"cpu"``. Nothing else changes.

With ``MMDATAGEN_EC_TRACE`` set to a file, the engine's scheduler also writes one JSON line per
item-level cache event to it, in the order the scheduler made them (the item-level truth the
client cannot see): ``front`` (vLLM's encoder cache had the item: the connector is not asked),
``alloc`` (the item got room in the encoder cache; ``dynamo`` tells whether the connector had
it: a load, else an encode and a save), ``evict`` (an encoder-cache entry freed for room) and
``free`` (the request let go of its item: its prefill has passed it). Each names the request,
the item's index in it, its identifier and its embedding count. Read-only: the wrappers call the
real methods and only look at their arguments and results.
"""
from __future__ import annotations

import functools
import importlib.abc
import importlib.machinery
import json
import os
import sys

TARGET = "dynamo.vllm.multimodal_utils.multimodal_embedding_cache_connector"
ENCODER_CACHE = "vllm.v1.core.encoder_cache_manager"
TRACE = os.environ.get("MMDATAGEN_EC_TRACE")


def _cpu_device(vllm_config: object) -> str:
    return "cpu"


_trace_file = None


def _trace(kind: str, request, index: int, **more) -> None:  # type: ignore[no-untyped-def]
    global _trace_file
    if _trace_file is None:
        _trace_file = open(TRACE, "a", buffering=1)
    feature = request.mm_features[index]
    _trace_file.write(json.dumps({
        "kind": kind, "request": request.request_id, "index": index,
        "key": feature.identifier, "embeds": request.get_num_encoder_embeds(index),
        "pid": os.getpid(), **more}) + "\n")


def _trace_connector(module) -> None:  # type: ignore[no-untyped-def]
    cls = module.DynamoMultimodalEmbeddingCacheConnector
    alloc = cls.update_state_after_alloc

    @functools.wraps(alloc)
    def update_state_after_alloc(self, request, index):  # type: ignore[no-untyped-def]
        had = request.mm_features[index].identifier in self._cache_order
        _trace("alloc", request, index, dynamo=had)
        return alloc(self, request, index)

    cls.update_state_after_alloc = update_state_after_alloc


def _trace_encoder_cache(module) -> None:  # type: ignore[no-untyped-def]
    cls = module.EncoderCacheManager
    check, can, free = cls.check_and_update_cache, cls.can_allocate, cls.free_encoder_input

    @functools.wraps(check)
    def check_and_update_cache(self, request, input_id):  # type: ignore[no-untyped-def]
        hit = check(self, request, input_id)
        if hit:
            _trace("front", request, input_id)
        return hit

    @functools.wraps(can)
    def can_allocate(self, request, input_id, *args):  # type: ignore[no-untyped-def]
        before = len(self.freed)
        ok = can(self, request, input_id, *args)
        for key in self.freed[before:]:
            _trace("evict", request, input_id, evicted=key)
        return ok

    @functools.wraps(free)
    def free_encoder_input(self, request, input_id):  # type: ignore[no-untyped-def]
        _trace("free", request, input_id)
        return free(self, request, input_id)

    cls.check_and_update_cache = check_and_update_cache
    cls.can_allocate = can_allocate
    cls.free_encoder_input = free_encoder_input


class _Loader(importlib.abc.Loader):
    def __init__(self, inner: importlib.abc.Loader, name: str) -> None:
        self.inner, self.name = inner, name

    def create_module(self, spec):  # type: ignore[no-untyped-def]
        return self.inner.create_module(spec)

    def exec_module(self, module) -> None:  # type: ignore[no-untyped-def]
        self.inner.exec_module(module)
        if self.name == ENCODER_CACHE:
            _trace_encoder_cache(module)
            return
        if TRACE:
            _trace_connector(module)
        if not hasattr(module, "_get_device"):
            raise ImportError(f"{TARGET} has no _get_device: the CPU hook is out of date")
        module._get_device = _cpu_device


class _Finder(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path, target=None):  # type: ignore[no-untyped-def]
        if name != TARGET and not (TRACE and name == ENCODER_CACHE):
            return None
        spec = importlib.machinery.PathFinder.find_spec(name, path)
        if spec is not None and spec.loader is not None:
            spec.loader = _Loader(spec.loader, name)
        return spec


sys.meta_path.insert(0, _Finder())
