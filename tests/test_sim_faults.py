"""Seeded fault injection, over real HTTP."""
from __future__ import annotations

import aiohttp
import orjson
import pytest
from sim_helpers import chat, run, running

from mmdatagen.errors import UserError
from mmdatagen.sim.faults import FaultConfig, FaultInjector

STREAM = dict(stream=True, max_tokens=6, ignore_eos=True, stream_options={"include_usage": True})


def test_draws_are_seeded_and_validated():
    cfg = FaultConfig(error_rate=0.3, disconnect_rate=0.3, malformed_rate=0.3, seed=7)
    a = [FaultInjector(cfg).draw(10) for _ in range(1)]
    s1 = FaultInjector(cfg)
    s2 = FaultInjector(cfg)
    seq1 = [s1.draw(10) for _ in range(50)]
    assert seq1 == [s2.draw(10) for _ in range(50)] and a[0] == seq1[0]
    assert seq1 != [FaultInjector(FaultConfig(error_rate=0.3, disconnect_rate=0.3,
                                              malformed_rate=0.3, seed=8)).draw(10)
                    for _ in range(50)]
    assert 5 < sum(f.error for f in seq1) < 30
    with pytest.raises(UserError):
        FaultConfig(error_rate=1.5).validate()
    with pytest.raises(UserError):
        FaultConfig(error_status=200).validate()


def test_error_rate_and_status():
    async def go():
        async with running(faults=FaultConfig(error_rate=1.0, error_status=503)) as (url, sim, s):
            async with s.post(url + "/v1/chat/completions", json=chat("x")) as resp:
                assert resp.status == 503
                assert (await resp.json())["error"]["code"] == "injected_fault"
            async with s.get(url + "/metrics") as resp:
                assert 'faults_injected_total{kind="error"} 1' in await resp.text()
    run(go())


def test_mid_stream_disconnect():
    async def go():
        async with running(faults=FaultConfig(disconnect_rate=1.0)) as (url, sim, s):
            with pytest.raises(aiohttp.ClientPayloadError):
                async with s.post(url + "/v1/chat/completions", json=chat("x", **STREAM)) as resp:
                    assert resp.status == 200
                    await resp.read()
            # the server keeps serving
            async with s.post(url + "/v1/chat/completions", json=chat("x")) as resp:
                assert resp.status == 500 or resp.status == 200
    run(go())


def test_malformed_chunk_and_stalls():
    async def go():
        cfg = FaultConfig(malformed_rate=1.0, stall_first_rate=1.0, stall_token_rate=1.0,
                          stall_ms=40.0)
        async with running(faults=cfg) as (url, sim, s):
            async with s.post(url + "/v1/chat/completions", json=chat("x", **STREAM)) as resp:
                ttft_ns = int(resp.headers["x-mmdatagen-server-ttft-ns"])
                events = [e for e in (await resp.read()).split(b"\n\n") if e]
            bad = 0
            for e in events[:-1]:
                try:
                    orjson.loads(e[6:])
                except orjson.JSONDecodeError:
                    bad += 1
            assert bad == 1 and events[-1] == b"data: [DONE]"
            assert ttft_ns >= 40_000_000  # the stall happens before the first token
            async with s.get(url + "/metrics") as resp:
                text = await resp.text()
            assert 'kind="malformed"} 1' in text and 'kind="stall"} 2' in text
    run(go())
