"""What a worker tells the coordinator about its sampler: both of echo2's engines draw with the
seeded sampler, so hf and vllm workers alike register as "seeded" (a run requiring the seeded
sampler, the default, admits them); the engine class says so, before any model loads."""

from __future__ import annotations

import asyncio

import pytest
from aiohttp import web

from echo2.config.broadcast import BroadcastConfig
from echo2.config.worker import WorkerConfig
from echo2.report.metrics import MetricsWriter
from echo2.rollout.diagnosis import WorkerFailed
from echo2.rollout.engine_factory import engine_type
from echo2.rollout.worker import Worker


def test_both_engines_draw_with_the_seeded_sampler():
    assert engine_type("hf").seeded and engine_type("vllm").seeded
    with pytest.raises(ValueError, match="unknown engine 'sglang'"):
        engine_type("sglang")


def _registration(tmp_path, engine: str) -> dict:
    """The body the worker posts to /v1/register (the coordinator here refuses it, so no engine
    is built: this needs no vLLM)."""
    seen = []

    async def register(request):
        seen.append(await request.json())
        return web.json_response({"kind": "error", "error": "not in this test"}, status=422)

    async def broadcast_config(request):
        return web.Response(text=BroadcastConfig().model_dump_json(), content_type="application/json")

    async def main():
        app = web.Application()
        app.add_routes([web.post("/v1/register", register), web.get("/v1/broadcast_config", broadcast_config)])
        runner = web.AppRunner(app)
        await runner.setup()
        await web.TCPSite(runner, "127.0.0.1", 0).start()
        host, port = runner.addresses[0][:2]
        worker = Worker(WorkerConfig(worker_id="w0", engine=engine, device="cpu"), f"http://{host}:{port}",
                        "join-token-0123456789", MetricsWriter(tmp_path / f"{engine}.jsonl", "worker"))
        try:
            with pytest.raises(WorkerFailed):
                await asyncio.wait_for(worker.run(asyncio.Event()), 30)
        finally:
            await runner.cleanup()

    asyncio.run(main())
    assert len(seen) == 1
    return seen[0]


@pytest.mark.parametrize("engine", ["hf", "vllm"])
def test_a_worker_registers_its_engines_sampler(tmp_path, engine):
    body = _registration(tmp_path, engine)
    assert body["engine"] == engine and body["sampler"] == "seeded"
