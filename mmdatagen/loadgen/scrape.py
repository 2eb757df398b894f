"""The server's Prometheus ``/metrics``: cache counters before/after a run, and a time series.

Known names (summed over label sets, per family):

- simulator: ``mmdatagen_sim_embedding_cache_{hits,misses}_total``,
  ``mmdatagen_sim_requests_running``, ``mmdatagen_sim_requests_waiting``;
- vLLM: ``vllm:mm_cache_queries`` / ``vllm:mm_cache_hits`` (processor cache; ``_total`` suffix
  on newer clients), ``vllm:num_requests_running``, ``vllm:num_requests_waiting``;
- Dynamo: ``dynamo_component_embedding_cache_{hits,misses}_total`` (aggregated embedding cache),
  ``dynamo_frontend_inflight_requests``, ``dynamo_frontend_queued_requests``.

A server without ``/metrics`` (or with none of these names) is fine: the sampler says so once and
the export records why there is no series.
"""
from __future__ import annotations

import asyncio
import sys
import time
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import aiohttp

# exposition name -> our key
COUNTERS: dict[str, str] = {
    "mmdatagen_sim_embedding_cache_hits_total": "sim_hits",
    "mmdatagen_sim_embedding_cache_misses_total": "sim_misses",
    "vllm:mm_cache_queries_total": "vllm_queries", "vllm:mm_cache_queries": "vllm_queries",
    "vllm:mm_cache_hits_total": "vllm_hits", "vllm:mm_cache_hits": "vllm_hits",
    "dynamo_component_embedding_cache_hits_total": "dynamo_hits",
    "dynamo_component_embedding_cache_misses_total": "dynamo_misses",
    "dynamo_component_embedding_cache_evictions_total": "dynamo_evictions",
    "mmdatagen_sim_embedding_cache_evictions_total": "sim_evictions",
    "mmdatagen_sim_encoder_cache_hits_total": "sim_encoder_hits",
}
GAUGES: dict[str, str] = {
    "mmdatagen_sim_requests_running": "running", "vllm:num_requests_running": "running",
    "dynamo_frontend_inflight_requests": "running",
    "mmdatagen_sim_requests_waiting": "waiting", "vllm:num_requests_waiting": "waiting",
    "dynamo_frontend_queued_requests": "waiting",
}
#: where a request's time goes on the server (``metrics.STAGES``, its own clock), summed over
#: requests: vLLM's histograms and the simulator's sums of the same stages -> our key
STAGE_SUMS: dict[str, str] = {
    "vllm:time_to_first_token_seconds_sum": "stage_ttft_s",
    "vllm:time_to_first_token_seconds_count": "stage_ttft_n",
    "vllm:request_queue_time_seconds_sum": "stage_queue_s",
    "vllm:request_prefill_time_seconds_sum": "stage_prefill_s",
    "vllm:request_decode_time_seconds_sum": "stage_decode_s",
    "vllm:request_queue_time_seconds_count": "stage_n",
    "mmdatagen_sim_time_to_first_token_seconds_sum": "stage_ttft_s",
    "mmdatagen_sim_request_queue_time_seconds_sum": "stage_queue_s",
    "mmdatagen_sim_request_prefill_time_seconds_sum": "stage_prefill_s",
    "mmdatagen_sim_request_decode_time_seconds_sum": "stage_decode_s",
    "mmdatagen_sim_request_stages_count": "stage_n",
}
# (source label, hits key, misses key or None, queries key or None, evictions key or None):
# the run's cache target names its family; otherwise the first present wins
FAMILIES = (("simulator /metrics", "sim_hits", "sim_misses", None, "sim_evictions"),
            ("vllm:mm_cache_*", "vllm_hits", None, "vllm_queries", None),
            ("dynamo_component_embedding_cache_*", "dynamo_hits", "dynamo_misses", None,
             "dynamo_evictions"))
#: a target's counter names (``CacheTarget.metrics``) -> the family that reports them
FAMILY_OF = {"vllm:mm_cache_hits_total": "vllm:mm_cache_*",
             "dynamo_component_embedding_cache_hits_total": "dynamo_component_embedding_cache_*"}


def parse_metrics(text: str) -> dict[str, float]:
    """Known counters and gauges from Prometheus text, summed across label sets."""
    out: dict[str, float] = {}
    for line in text.splitlines():
        if not line or line[0] == "#":
            continue
        name = line.split("{", 1)[0].split(" ", 1)[0]
        key = COUNTERS.get(name) or GAUGES.get(name) or STAGE_SUMS.get(name)
        if key is None:
            continue
        try:
            out[key] = out.get(key, 0.0) + float(line.rsplit(" ", 1)[-1])
        except ValueError:
            continue
    return out


def parse_cache_counters(text: str) -> dict[str, float]:
    """Only the cache counters (the before/after delta's input)."""
    counters = set(COUNTERS.values())
    return {k: v for k, v in parse_metrics(text).items() if k in counters}


async def fetch_metrics_text(url: str, timeout: float = 5.0,
                             session: aiohttp.ClientSession | None = None) -> str | None:
    """The body of ``GET {url}/metrics``; None when the server has none or is unreachable."""
    import aiohttp

    async def get(s: aiohttp.ClientSession) -> str | None:
        async with s.get(url.rstrip("/") + "/metrics") as resp:
            if resp.status != 200:
                return None
            return await resp.text()

    try:
        if session is not None:
            return await get(session)
        async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=timeout)) as s:
            return await get(s)
    except (TimeoutError, aiohttp.ClientError, OSError, ValueError):
        return None


async def scrape_metrics(url: str, timeout: float = 5.0) -> dict[str, float] | None:
    """Cache counters from ``/metrics`` (simulator, vLLM, Dynamo); None when unavailable."""
    text = await fetch_metrics_text(url, timeout)
    return None if text is None else parse_cache_counters(text)


def _family(d: dict) -> tuple[str, float, float] | None:
    """The first family present: (source, hits, queries)."""
    fams = _families(d)
    if not fams:
        return None
    src, fam = next(iter(fams.items()))
    return src, fam["hits"], fam["queries"]


def _families(d: dict) -> dict[str, dict]:
    """Every counter family present in ``d``: hits, queries (and evictions where counted)."""
    out = {}
    for src, hk, mk, qk, ek in FAMILIES:
        if hk in d:
            hits = d[hk]
            queries = d.get(qk, 0.0) if qk else hits + d.get(mk, 0.0)
            fam = {"hits": int(hits), "queries": int(queries)}
            if ek is not None:
                fam["evictions"] = int(d.get(ek, 0.0))
            out[src] = fam
    return out


def counter_delta(before: dict | None, after: dict | None,
                  target_metrics: dict | None = None) -> dict | None:
    """Hits/queries over the run from two scrapes: the family of the run's cache target
    (``target_metrics``: its counter names; a plain vLLM with Dynamo's connector shows both
    vLLM's processor cache and Dynamo's), else the first family present. Every family's
    deltas are kept under ``families``.

    ``before`` may be empty (labelled counters appear only after their first increment);
    None means the scrape failed.
    """
    if before is None or not after:
        return None
    d = {k: after.get(k, 0.0) - before.get(k, 0.0) for k in after}
    fams = _families(d)
    if not fams:
        return None
    wanted = FAMILY_OF.get((target_metrics or {}).get("hits", ""))
    src = wanted if wanted in fams else next(iter(fams))
    fam = fams[src]
    out = {"source": src, **fam,
           "hit_rate": fam["hits"] / fam["queries"] if fam["queries"] else None,
           "note": "includes warmup requests and any other traffic"}
    if "sim_encoder_hits" in d:
        out["encoder_hits"] = int(d["sim_encoder_hits"])
    if len(fams) > 1:
        out["families"] = fams
    return out


def stage_delta(before: dict | None, after: dict | None) -> dict[str, Any]:
    """Where the run's requests spent their time on the server (``metrics.stage_block``), from
    two scrapes of its stage sums (:data:`STAGE_SUMS`). vLLM's time to first token starts
    when it begins rendering the request (its body read), so the frontend's is that less
    queue and prefill."""
    from ..metrics import stage_block

    if not before or not after or "stage_n" not in after:
        return {"available": False,
                "reason": "the server's /metrics has no request stage times"}
    d = {k: after.get(k, 0.0) - before.get(k, 0.0) for k in after if k.startswith("stage_")}
    n = int(round(d.get("stage_n", 0.0)))
    if n <= 0:
        return {"available": False, "reason": "no request finished between the two scrapes"}
    sums = {k: 1000.0 * d.get(f"stage_{k}_s", 0.0) for k in ("queue", "prefill", "decode")}
    ttft = 1000.0 * d.get("stage_ttft_s", 0.0) * n / max(d.get("stage_ttft_n", n), 1.0)
    sums["frontend"] = ttft - sums["queue"] - sums["prefill"]
    return stage_block(sums, n, "the server's own clock")


class MetricsSampler:
    """Scrapes ``/metrics`` every ``interval_s`` seconds while a run is under way.

    Each sample keeps the time (``perf_counter_ns``, the records' clock) and the known counters
    and gauges. :meth:`series` turns them into the export's ``server_metrics_timeseries``: time
    in seconds from the first profiling request, queue depth, running requests, and the cache
    hit rate of each interval (from counter deltas).
    """

    def __init__(self, url: str, interval_s: float = 1.0, quiet: bool = False) -> None:
        self.url = url
        self.interval_s = max(0.05, float(interval_s))
        self.quiet = quiet
        self.samples: list[tuple[int, dict[str, float]]] = []
        self.unavailable: str | None = None
        self._task: asyncio.Task[None] | None = None
        self._session: aiohttp.ClientSession | None = None

    async def _scrape(self) -> dict[str, float] | None:
        text = await fetch_metrics_text(self.url, session=self._session)
        if text is None:
            return None
        vals = parse_metrics(text)
        self.samples.append((time.perf_counter_ns(), vals))
        return vals

    async def start(self) -> dict[str, float] | None:
        """First scrape (the 'before' counters); starts the periodic task when it answered."""
        import aiohttp

        session = self._session = aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=5.0))
        first = await self._scrape()
        if first is None:
            self.unavailable = "the server has no /metrics (or it did not answer)"
        elif not first:
            self.unavailable = "the server's /metrics has none of the known names"
        if self.unavailable is not None:
            if not self.quiet:
                print(f"note: server metrics not collected: {self.unavailable}", file=sys.stderr)
            if first is None:
                await session.close()
                self._session = None
                return None
        else:
            self._task = asyncio.ensure_future(self._loop())
        return parse_cache_subset(first)

    async def _loop(self) -> None:
        while True:
            await asyncio.sleep(self.interval_s)
            await self._scrape()

    async def stop(self) -> dict[str, float] | None:
        """Stop sampling; one last scrape (the 'after' counters)."""
        if self._task is not None:
            self._task.cancel()
            try:
                await self._task
            except (asyncio.CancelledError, Exception):
                pass
            self._task = None
        last = None
        if self._session is not None:
            last = await self._scrape()
            await self._session.close()
            self._session = None
        return parse_cache_subset(last)

    async def close(self) -> None:
        """Release the task and the HTTP session (idempotent)."""
        if self._task is not None:
            self._task.cancel()
            self._task = None
        if self._session is not None:
            await self._session.close()
            self._session = None

    def stages(self) -> dict[str, Any]:
        """The run's request stages (:func:`stage_delta`) from the first and last scrape."""
        if len(self.samples) < 2:
            return {"available": False, "reason": self.unavailable or "fewer than two scrapes"}
        return stage_delta(self.samples[0][1], self.samples[-1][1])

    def series(self, base_ns: int | None, scale: float = 1.0) -> dict[str, Any]:
        """The export block: aligned to ``base_ns`` (first profiling start), simulated seconds."""
        if self.unavailable is not None and (not self.samples or not any(v for _, v in self.samples)):
            return {"available": False, "reason": self.unavailable, "url": self.url}
        return build_series(self.samples, base_ns, scale, self.interval_s, self.url)


def parse_cache_subset(vals: dict[str, float] | None) -> dict[str, float] | None:
    if vals is None:
        return None
    counters = set(COUNTERS.values())
    return {k: v for k, v in vals.items() if k in counters}


def build_series(samples: list[tuple[int, dict[str, float]]], base_ns: int | None, scale: float,
                 interval_s: float, url: str = "") -> dict[str, Any]:
    """Samples -> columns: ``t_s``, ``running``, ``waiting``, ``hit_rate`` (per interval)."""
    if not samples:
        return {"available": False, "reason": "no samples", "url": url}
    base = base_ns if base_ns is not None else samples[0][0]
    t = [round((ns - base) / 1e9 / scale, 4) for ns, _ in samples]
    running = [v.get("running") for _, v in samples]
    waiting = [v.get("waiting") for _, v in samples]
    fams = [_family(v) for _, v in samples]
    source = next((f[0] for f in fams if f is not None), None)
    hits_cum = [None if f is None else f[1] for f in fams]
    queries_cum = [None if f is None else f[2] for f in fams]
    hit_rate: list[float | None] = [None] * len(samples)
    for i in range(1, len(samples)):
        a, b = fams[i - 1], fams[i]
        if a is not None and b is not None and b[2] - a[2] > 0:
            hit_rate[i] = (b[1] - a[1]) / (b[2] - a[2])
    return {"available": True, "url": url, "interval_s": interval_s / scale,
            "time_unit": "s from the first profiling request" + (" (simulated)" if scale != 1
                                                                 else ""),
            "cache_source": source, "t_s": t, "running": running, "waiting": waiting,
            "cache_hits": hits_cum, "cache_queries": queries_cum, "hit_rate": hit_rate}
