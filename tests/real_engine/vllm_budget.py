"""Run by the engine virtualenv's python: vLLM's own encoder-cache budget for engine settings,
computed the way its scheduler and model runner compute it, without starting a server.

Input (stdin): a JSON list of objects with ``model``, ``max_num_batched_tokens``,
``max_model_len`` and ``limit_mm_per_prompt``. Output (stdout): one JSON object per input line,
in order: the settings vLLM resolved and ``MultiModalBudget``'s values (``budget`` is what the
startup line "Encoder cache will be initialized with a budget of N tokens" prints; ``cache`` is
the size the scheduler gives its encoder cache manager).
"""
from __future__ import annotations

import json
import os
import sys

for _k, _v in {"HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1", "VLLM_HOST_IP": "127.0.0.1",
               "VLLM_NO_USAGE_STATS": "1", "VLLM_CPU_KVCACHE_SPACE": "1"}.items():
    os.environ.setdefault(_k, _v)


def main() -> int:
    from vllm.engine.arg_utils import EngineArgs
    from vllm.multimodal import MULTIMODAL_REGISTRY
    from vllm.multimodal.encoder_budget import MultiModalBudget
    from vllm.usage.usage_lib import UsageContext

    for case in json.load(sys.stdin):
        args = EngineArgs(model=case["model"], dtype="bfloat16", enable_prefix_caching=False,
                          max_model_len=case["max_model_len"],
                          max_num_batched_tokens=case["max_num_batched_tokens"],
                          limit_mm_per_prompt=case["limit_mm_per_prompt"])
        config = args.create_engine_config(UsageContext.OPENAI_API_SERVER)
        budget = MultiModalBudget(config, MULTIMODAL_REGISTRY)
        sched = config.scheduler_config
        print("RESULT " + json.dumps({
            "max_num_batched_tokens": sched.max_num_batched_tokens,
            "max_num_seqs": sched.max_num_seqs, "chunked_prefill": sched.enable_chunked_prefill,
            "budget": budget.get_encoder_budget(), "cache": budget.encoder_cache_size,
            "max_tokens_per_item": dict(budget.mm_max_toks_per_item),
            "items_profiled": dict(budget.mm_max_items_per_batch)}), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
