"""A worker whose coordinator answers heartbeats with malformed replies keeps beating (the loop
used to die on the first parse error, leaving the worker deaf to new versions)."""

from __future__ import annotations

import asyncio

from aiohttp import web

from echo2.config.broadcast import BroadcastConfig
from echo2.config.worker import WorkerConfig
from echo2.protocol.messages import RegisterResponse, SamplingParams
from echo2.report.metrics import MetricsWriter, read_metrics
from echo2.rollout.worker import Worker

TOKEN = "join-token-0123456789"


def test_malformed_heartbeat_replies_do_not_stop_the_heartbeats(tmp_path, tiny_model_dir):
    beats = []

    async def register(request):
        reply = RegisterResponse(worker_id="w0", heartbeat_interval_s=0.1, max_staleness=1,
                                 sampling=SamplingParams(temperature=1.0, max_new_tokens=4, group_size=2),
                                 model_source=str(tiny_model_dir), broadcast={},
                                 learner_public_key="", credential="c" * 64)
        return web.Response(text=reply.model_dump_json(), content_type="application/json")

    async def heartbeat(request):
        beats.append(request.headers["Authorization"])
        return web.json_response({"kind": "heartbeat_ack", "latest": {"bogus": True}})  # not a HeartbeatResponse

    async def broadcast_config(request):
        return web.Response(text=BroadcastConfig().model_dump_json(), content_type="application/json")

    async def refuse(request):
        return web.json_response({"kind": "error", "error": "not now"}, status=503)

    async def main():
        app = web.Application()
        app.add_routes([web.post("/v1/register", register), web.post("/v1/heartbeat", heartbeat),
                        web.get("/v1/broadcast_config", broadcast_config), web.post("/v1/lease", refuse),
                        web.post("/v1/leave", refuse)])
        runner = web.AppRunner(app)
        await runner.setup()
        site = web.TCPSite(runner, "127.0.0.1", 0)
        await site.start()
        host, port = runner.addresses[0][:2]
        worker = Worker(WorkerConfig(worker_id="w0", device="cpu"), f"http://{host}:{port}", TOKEN,
                        MetricsWriter(tmp_path / "m.jsonl", "worker"))
        stop = asyncio.Event()
        task = asyncio.create_task(worker.run(stop))
        try:
            deadline = asyncio.get_running_loop().time() + 20
            while len(beats) < 5 and asyncio.get_running_loop().time() < deadline:
                await asyncio.sleep(0.05)
        finally:
            stop.set()
            await asyncio.wait_for(task, 20)
            await runner.cleanup()

    asyncio.run(main())
    assert len(beats) >= 5  # still beating after the first malformed reply
    assert set(beats) == {"Bearer " + "c" * 64}  # with its own credential, not the join token
    bad = [r for r in read_metrics(tmp_path / "m.jsonl") if r["kind"] == "worker_bad_reply"]
    assert len(bad) >= 4 and bad[0]["what"] == "heartbeat"
