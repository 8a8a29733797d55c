"""The learner's network side, on one background thread with its own asyncio loop: the weight
server workers fetch published versions from, and the client for the coordinator. The torch
training loop calls the blocking wrappers and never touches the loop directly."""

from __future__ import annotations

import asyncio
import threading
import time
from collections import OrderedDict
from collections.abc import Coroutine
from typing import Any

import aiohttp
from aiohttp import web

from echo2.broadcast.manifest import build_manifest
from echo2.protocol.http import TransientError, call
from echo2.protocol.messages import BatchResponse, PublishRequest, TrainGroup, VersionInfo

# transient failures (coordinator restarting, connection reset) are retried for this long
# before the learner gives up; long enough to ride out a coordinator restart
RETRY_WINDOW_S = 120.0


class LearnerIO:
    def __init__(self, coordinator_url: str, token: str, host: str, port: int, keep_versions: int,
                 request_timeout_s: float) -> None:
        self.coordinator_url = coordinator_url.rstrip("/")
        self.headers = {"Authorization": f"Bearer {token}"}
        self.host, self.port, self.keep = host, port, keep_versions
        self.request_timeout_s = request_timeout_s
        self.versions: OrderedDict[int, bytes] = OrderedDict()
        self.loop = asyncio.new_event_loop()
        self.thread = threading.Thread(target=self.loop.run_forever, name="learner-io", daemon=True)

    # ---- lifecycle ----
    def start(self) -> None:
        self.thread.start()
        self._call(self._setup(), timeout_s=30)

    def close(self) -> None:
        if self.thread.is_alive():
            self._call(self._teardown(), timeout_s=30)
            self.loop.call_soon_threadsafe(self.loop.stop)
            self.thread.join(timeout=10)

    def _call(self, coro: Coroutine[Any, Any, Any], timeout_s: float) -> Any:
        return asyncio.run_coroutine_threadsafe(coro, self.loop).result(timeout=timeout_s)

    async def _setup(self) -> None:
        self.session = aiohttp.ClientSession(headers=self.headers)
        app = web.Application()
        app.add_routes([web.get("/v1/weights/{version}", self._serve_weights)])
        self.runner = web.AppRunner(app, access_log=None)
        await self.runner.setup()
        site = web.TCPSite(self.runner, self.host, self.port)
        await site.start()
        host, port = self.runner.addresses[0][:2]
        self.weights_base_url = f"http://{host}:{port}"

    async def _teardown(self) -> None:
        await self.session.close()
        await self.runner.cleanup()

    # ---- weight server ----
    async def _serve_weights(self, request: web.Request) -> web.Response:
        if request.headers.get("Authorization") != self.headers["Authorization"]:
            return web.json_response({"error": "missing or wrong bearer token"}, status=401)
        try:
            payload = self.versions.get(int(request.match_info["version"]))
        except ValueError:
            payload = None
        if payload is None:
            return web.json_response({"error": f"version not held; held: {list(self.versions)}"}, status=404)
        return web.Response(body=payload, content_type="application/octet-stream")

    def publish(self, version: int, payload: bytes, chunk_bytes: int) -> VersionInfo:
        manifest = build_manifest(version, payload, chunk_bytes, published_at=time.time())
        info = VersionInfo(version=version, manifest=manifest, weights_url=f"{self.weights_base_url}/v1/weights/{version}")

        def keep() -> None:
            self.versions[version] = payload
            while len(self.versions) > self.keep:
                self.versions.popitem(last=False)

        self.loop.call_soon_threadsafe(keep)
        body = PublishRequest(info=info)
        self._with_retries(lambda: self._post("/v1/publish", body), self.request_timeout_s)
        return info

    # ---- coordinator client ----
    def fetch_batch(self, step: int, wait_s: float, step_time_s: float | None = None) -> list[TrainGroup]:
        """Groups for `step`; empty when the long poll ended before the batch was ready.
        `step_time_s`, the learner's busy time on its last step, feeds the activation controller."""
        url = f"/v1/batch?step={step}&wait_s={wait_s}"
        if step_time_s is not None:
            url += f"&step_time_s={step_time_s:.6f}"
        text = self._with_retries(lambda: self._get(url, extra_timeout_s=wait_s), self.request_timeout_s + wait_s)
        return BatchResponse.model_validate_json(text).groups

    def _with_retries(self, make_call, timeout_s: float) -> str:
        deadline = time.monotonic() + RETRY_WINDOW_S
        delay_s = 0.2
        while True:
            try:
                # the request carries its own timeout; this outer one only guards a wedged loop
                return self._call(make_call(), timeout_s=timeout_s + 10)
            except TransientError:
                if time.monotonic() > deadline:
                    raise
                time.sleep(delay_s)
                delay_s = min(delay_s * 2, 5.0)

    async def _post(self, path: str, body: PublishRequest) -> str:
        return await call(self.session, "POST", self.coordinator_url + path, body, self.request_timeout_s)

    async def _get(self, path: str, extra_timeout_s: float) -> str:
        return await call(self.session, "GET", self.coordinator_url + path, None, self.request_timeout_s + extra_timeout_s)
