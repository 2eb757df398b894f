"""``bench --reset-cache``: empty the server's caches before warmup, so a run starts cold (as
the prediction assumes) instead of warm from the run before.

Tries vLLM's dev-mode endpoints (``VLLM_SERVER_DEV_MODE=1``: ``/reset_prefix_cache``,
``/reset_mm_cache``, ``/reset_encoder_cache``) and the simulator's ``/mmdatagen/reset_cache``.
A server that exposes none of them answers 404 (or 405): the run goes on and says it may start
warm. Dynamo's embedding-cache connector has no reset endpoint: only a restart empties it.
"""
from __future__ import annotations

from typing import Any

from ..caches import RESET_PATHS


async def reset_server_caches(url: str, timeout: float = 10.0) -> dict[str, Any]:
    """POST every known reset endpoint; ``{"endpoints": {path: status or error}, "reset":
    [paths that answered 2xx], "note"}``."""
    import aiohttp

    statuses: dict[str, Any] = {}
    async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=timeout)) as s:
        for path in RESET_PATHS:
            try:
                async with s.post(url.rstrip("/") + path) as resp:
                    statuses[path] = resp.status
            except (TimeoutError, aiohttp.ClientError, OSError) as exc:
                statuses[path] = type(exc).__name__
    done = [p for p, v in statuses.items() if isinstance(v, int) and 200 <= v < 300]
    if done:
        note = "reset: " + ", ".join(done)
    elif not any(isinstance(v, int) for v in statuses.values()):  # no answer at all
        note = ("the server did not answer the cache-reset requests ("
                + ", ".join(sorted(set(statuses.values()))) + "): no cache was reset")
    else:
        note = ("the server exposes no cache-reset endpoint (vLLM: start it with "
                "VLLM_SERVER_DEV_MODE=1): the run may start with warm caches")
    if done and "/mmdatagen/reset_cache" not in done:
        note += "; Dynamo's embedding cache, if any, is not reset by them (a restart is)"
    return {"endpoints": statuses, "reset": done, "note": note}
