"""Sharded load workers: ``bench --num-shards N --shard-index K`` sends worker K's share of the
benchmark one process would send, so N machines (a Kubernetes Indexed Job) drive a cluster
together and ``merge-runs`` joins their records into one export.

- Sessions are dealt round-robin in first-appearance order and never split
  (``sessions.shard_owns``); ``random_pool`` draws come from the one seeded stream, every Nth
  draw each. A session's turns keep their order.
- ``--request-count``, ``--warmup-request-count`` and ``--concurrency`` are divided so the
  shares add up to the whole (worker K gets ``total*(K+1)//N - total*K//N``); ``--request-rate``
  (and a ramp's end rate) is divided by N. Each worker paces with its own seed derived from
  ``--seed``, so the N schedules are independent draws.
- ``--start-at EPOCH`` makes every worker wait for one common start.
- Each worker measures its clock against the server's with a few probes (the simulator's
  ``x-mmdatagen-server-time-ns`` header, else HTTP ``Date``, 1 s resolution), so merging puts
  every record on the server's clock.
"""
from __future__ import annotations

import asyncio
import time
from dataclasses import dataclass, replace
from email.utils import parsedate_to_datetime
from typing import TYPE_CHECKING, Any

import numpy as np

from ..errors import SpecError, UserError

if TYPE_CHECKING:
    from ..settings.run import BenchRun

CLOCK_HEADER = "x-mmdatagen-server-time-ns"
PROBES = 5


@dataclass(frozen=True)
class Shard:
    index: int = 0
    count: int = 1

    @property
    def sharded(self) -> bool:
        return self.count > 1

    def share(self, total: int | None) -> int | None:
        if total is None:
            return None
        return total * (self.index + 1) // self.count - total * self.index // self.count

    def seed(self, seed: int) -> int:
        """The worker's pacing seed (the seed itself for one worker)."""
        if not self.sharded:
            return seed
        return int(np.random.SeedSequence([seed, self.index, self.count]).generate_state(1)[0])


def shard_config(load: Any, url: str | None, shard: Shard) -> Any:
    """Worker ``shard``'s part of a run's ``settings.load.Load``: counts, concurrency and rate
    divided."""
    if not shard.sharded:
        return load
    if url is None:
        raise SpecError("num_shards", "needs url: the workers share one server (run 'mmdatagen "
                                      "serve' for the simulator)")
    if load.fixed_schedule:
        raise SpecError("num_shards", "does not combine with fixed_schedule")
    conc = shard.share(load.concurrency if load.concurrency is not None
                       else (None if load.request_rate else 1))
    if conc is not None and conc < 1:
        raise SpecError("concurrency", f"must be at least num_shards ({shard.count}): every "
                                       "worker needs a slot")
    count = shard.share(load.request_count)
    if count is not None and count < 1:
        raise SpecError("request_count", f"must be at least num_shards ({shard.count})")
    rate = None if load.request_rate is None else load.request_rate / shard.count
    ramp = None if load.ramp_to is None else load.ramp_to / shard.count
    return replace(load, concurrency=conc, request_count=count, request_rate=rate, ramp_to=ramp,
                   warmup_request_count=shard.share(load.warmup_request_count) or 0)


def worker_run(run: BenchRun) -> BenchRun:
    """The part of ``run`` this process sends: its start time checked, and a sharded worker's
    share (:func:`shard_config`) with the undivided benchmark's settings digest."""
    seconds_to_start(run.shard.start_at)
    if run.shard.num_shards <= 1:
        return run
    share = shard_config(run.load, run.target.url,
                         Shard(run.shard.shard_index, run.shard.num_shards))
    return replace(run, load=share, shard_digest=settings_digest(run.public()))


MAX_AHEAD_S = 7 * 86400.0


def seconds_to_start(start_at: float | None, now: float | None = None) -> float:
    """Seconds until ``start_at`` (Unix seconds; 0 without one); a time in the past, or more
    than a week ahead, is refused."""
    if start_at is None:
        return 0.0
    now = time.time() if now is None else now
    if start_at <= now:
        raise SpecError("start_at", f"is {now - start_at:.1f} s in the past: give a time ahead "
                                    "of every worker's start (e.g. $(( $(date +%s) + 60 )))")
    if start_at - now > MAX_AHEAD_S:
        raise SpecError("start_at", f"is {start_at - now:.0f} s ahead (more than a week)")
    return start_at - now


def settings_digest(public: dict) -> str:
    """What makes two workers parts of one benchmark: every setting but where a worker writes
    and which worker it is."""
    import blake3
    import orjson

    same = {k: v for k, v in public.items() if k not in ("output_dir", "shard_index")}
    return blake3.blake3(orjson.dumps(same, option=orjson.OPT_SORT_KEYS)).hexdigest()


def file_digest(path: Any) -> str:
    import blake3

    h = blake3.blake3()
    with open(path, "rb") as fh:
        while chunk := fh.read(1 << 22):
            h.update(chunk)
    return h.hexdigest()


def _server_ns(headers: Any) -> tuple[int, int, str] | None:
    """(server Unix ns, resolution ns, source) from one response's headers."""
    stamp = headers.get(CLOCK_HEADER)
    if stamp is not None:
        try:
            return int(stamp), 1, "simulator clock header"
        except ValueError:
            return None
    date = headers.get("Date")
    if date is None:
        return None
    try:
        return int(parsedate_to_datetime(date).timestamp() * 1e9), 1_000_000_000, "HTTP Date"
    except (TypeError, ValueError):
        return None


async def probe_clock(url: str, probes: int = PROBES, timeout: float = 5.0) -> dict[str, Any]:
    """This machine's wall clock against the server's: ``offset_ns`` (server minus local, from
    the probe with the shortest round trip), ``uncertainty_ns`` (half that round trip plus the
    server clock's resolution) and the source; ``offset_ns`` None when the server tells no
    time."""
    import aiohttp

    best: tuple[int, int, int, str] | None = None  # rtt, offset, resolution, source
    try:
        async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=timeout)) as s:
            for _ in range(probes):
                t0 = time.time_ns()
                async with s.get(url.rstrip("/") + "/v1/models") as resp:
                    await resp.read()
                    t1 = time.time_ns()
                    got = _server_ns(resp.headers)
                if got is None:
                    continue
                rtt, offset = t1 - t0, got[0] - (t0 + t1) // 2
                if best is None or rtt < best[0]:
                    best = (rtt, offset, got[1], got[2])
    except (TimeoutError, aiohttp.ClientError, OSError) as exc:
        raise UserError(f"cannot reach the server to measure its clock: {exc}") from None
    if best is None:
        return {"offset_ns": None, "uncertainty_ns": None, "source": "none (no Date header)"}
    rtt, offset, resolution, source = best
    return {"offset_ns": offset, "uncertainty_ns": rtt // 2 + resolution // 2,
            "source": source, "probes": probes}


async def worker_start(url: str, shard: Any) -> dict[str, Any] | None:
    """A worker's start, once its requests are ready: its clock against the server's (a
    sharded worker; None for an undivided run), then the wait for the agreed start time."""
    clock = await probe_clock(url) if shard.num_shards > 1 else None
    if shard.start_at is not None:
        await asyncio.sleep(seconds_to_start(shard.start_at))
    return clock
