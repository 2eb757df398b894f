"""Dynamo's embedding-cache connector on the CPU engine (loaded by vLLM, not by the test suite).

``DynamoMultimodalEmbeddingCacheConnector`` moves the embeddings it loads to ``"cuda"`` unless the
engine's device is CUDA or XPU; on vLLM's CPU build that fails at the first cache hit. This
subclass keeps them on the CPU and changes nothing else. The folder holding this module goes on
the server's ``PYTHONPATH``; the server names it in ``--ec-transfer-config``
(``ec_connector_module_path`` ``dynamo_cpu_connector``, ``ec_connector``
``CpuDynamoEmbeddingCacheConnector``).
"""
from dynamo.vllm.multimodal_utils.multimodal_embedding_cache_connector import (
    DynamoMultimodalEmbeddingCacheConnector,
)


class CpuDynamoEmbeddingCacheConnector(DynamoMultimodalEmbeddingCacheConnector):
    def __init__(self, vllm_config, role) -> None:
        super().__init__(vllm_config, role)
        self._device = "cpu"
