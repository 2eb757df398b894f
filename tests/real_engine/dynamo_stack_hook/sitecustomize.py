"""Run Dynamo's embedding-cache connector on a CPU-only engine (the real-engine suite only).

Dynamo's vLLM worker wires ``DynamoMultimodalEmbeddingCacheConnector`` itself, and the connector
moves every loaded embedding to the device ``_get_device`` names: ``"cuda"`` unless vLLM's device
is CUDA or XPU. On the CPU engine that is wrong (the worker dies on the first cache hit with
"Torch not compiled with CUDA enabled"). This file, put first on ``PYTHONPATH`` by
``tests/real_engine/dynamo_stack.py``, is imported by ``site`` at every interpreter start (the
worker, vLLM's engine-core process, the frontend); it wraps the loader of that one module so that,
after the module runs, its ``_get_device`` answers ``"cpu"``. Nothing else changes.
"""
from __future__ import annotations

import importlib.abc
import importlib.machinery
import sys

TARGET = "dynamo.vllm.multimodal_utils.multimodal_embedding_cache_connector"


def _cpu_device(vllm_config: object) -> str:
    return "cpu"


class _Loader(importlib.abc.Loader):
    def __init__(self, inner: importlib.abc.Loader) -> None:
        self.inner = inner

    def create_module(self, spec):  # type: ignore[no-untyped-def]
        return self.inner.create_module(spec)

    def exec_module(self, module) -> None:  # type: ignore[no-untyped-def]
        self.inner.exec_module(module)
        if not hasattr(module, "_get_device"):
            raise ImportError(f"{TARGET} has no _get_device: the CPU hook is out of date")
        module._get_device = _cpu_device


class _Finder(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path, target=None):  # type: ignore[no-untyped-def]
        if name != TARGET:
            return None
        spec = importlib.machinery.PathFinder.find_spec(name, path)
        if spec is not None and spec.loader is not None:
            spec.loader = _Loader(spec.loader)
        return spec


sys.meta_path.insert(0, _Finder())
