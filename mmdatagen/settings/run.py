"""One benchmark run: ``bench``'s, each of ``ab``'s two and each of a ``sweep``'s, as the specs it
was given, composed and frozen (nothing copied, no default of its own).

What differs between the runs of one ``ab`` or ``sweep`` is a spec field replaced
(``dataclasses.replace``): the profile, the cache size, the seed, the output folder. The
embedded simulator's settings derive from the run in one place (:meth:`BenchRun.simulator`),
and so does the config an export records (:meth:`BenchRun.public`).
"""
from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Any

from .cache import BenchCache, Geometry
from .load import BenchTarget, Load, LoadShard
from .sim import Simulator

SECRET_HEADER = re.compile(r"authorization|api[-_]?key|token|secret|cookie", re.IGNORECASE)
IMAGE_CACHE_BYTES = 1 << 30  # encoded images the loader keeps between requests


@dataclass(frozen=True)
class BenchRun:
    """The specs of one benchmark run; the loader (``loadgen.run.run_bench``) takes this."""

    load: Load
    target: BenchTarget = field(default_factory=BenchTarget)
    cache: BenchCache = field(default_factory=BenchCache)
    geometry: Geometry = field(default_factory=Geometry)
    shard: LoadShard = field(default_factory=LoadShard)
    slos: tuple[tuple[str, float], ...] = ()  # --goodput: (tag, objective ms), parsed
    shard_digest: str | None = None  # a worker's: the undivided benchmark's settings
    image_cache_bytes: int = IMAGE_CACHE_BYTES

    @property
    def max_response_bytes(self) -> int:
        return int(self.load.max_response_mb * (1 << 20))

    def simulator(self) -> Simulator:
        """The embedded simulator's settings: the run's profile, cache target and capacity,
        model geometry and time scale, then ``--sim-arg`` (parsed and checked here, before any
        server starts: a bad one is one error line)."""
        from dataclasses import replace

        from .sim import parse_sim_args

        values: dict[str, Any] = {"profile": self.load.profile, "cache": self.cache.cache,
                                  "cache_size": self.cache.cache_size,
                                  "encoder_budget": self.cache.encoder_budget,
                                  "time_scale": self.load.time_scale}
        base = replace(Simulator(), geometry=self.geometry).with_values(values)
        return parse_sim_args(self.load.sim_args, base)

    def public(self) -> dict[str, Any]:
        """The run's settings as exports record them (the names exports have always used): no
        API key, secret-looking headers redacted."""
        ld, t, c, g = self.load, self.target, self.cache, self.geometry
        return {
            "input_file": str(ld.input_file), "model": ld.model, "url": t.url,
            "dataset_type": ld.dataset_type, "concurrency": ld.concurrency,
            "request_count": ld.request_count, "warmup_request_count": ld.warmup_request_count,
            "extra_inputs": dict(ld.extras), "streaming": ld.streaming,
            "output_dir": str(t.output_dir), "request_rate": ld.request_rate,
            "arrival": ld.arrival, "burstiness": ld.burstiness, "ramp_to": ld.ramp_to,
            "benchmark_duration": ld.benchmark_duration, "request_timeout": ld.request_timeout,
            "headers": {k: ("<redacted>" if SECRET_HEADER.search(k) else v)
                        for k, v in ld.header_map.items()},
            "endpoint_type": ld.endpoint_type, "profile": ld.profile, "cache_gb": c.cache_size,
            "cache": c.target_name, "cache_explicit": c.cache is not None,
            "encoder_budget": c.encoder_budget, "metrics_url": t.metrics_url,
            "reset_cache": ld.reset_cache, "num_shards": self.shard.num_shards,
            "shard_index": self.shard.shard_index, "start_at": self.shard.start_at,
            "shard_digest": self.shard_digest,
            "model_path": None if g.model_path is None else str(g.model_path),
            "geometry": g.values(), "sim_args": list(ld.sim_args), "time_scale": ld.time_scale,
            "http_client": ld.http_client, "grace_period": ld.grace_period, "seed": ld.seed,
            "quiet": ld.quiet, "predict": not ld.no_predict, "fixed_schedule": ld.fixed_schedule,
            "image_cache_bytes": self.image_cache_bytes, "goodput": dict(self.slos),
            "metrics_interval": ld.metrics_interval,
            "max_response_bytes": self.max_response_bytes, "api_key_set": ld.api_key is not None,
        }
