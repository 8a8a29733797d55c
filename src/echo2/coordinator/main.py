"""Start the coordinator service for a run: state restored from the run dir's SQLite store,
its scoring processes, HTTP on the configured address, the bound URL written to
`<run_dir>/coordinator.json`."""

from __future__ import annotations

import asyncio
import json
import logging
import os
import resource
import signal

from aiohttp import web

from echo2.config.run import RunConfig
from echo2.config.task import trusted_workers_only
from echo2.coordinator.http.server import build_app
from echo2.coordinator.parts.credentials import coordinator_secrets
from echo2.coordinator.records.store import Store
from echo2.coordinator.scoring.pool import ScoringPool
from echo2.coordinator.scoring.scorer import make_scorer, scorer_recipe
from echo2.coordinator.state import CoordinatorState
from echo2.protocol import tls
from echo2.report.metrics import MetricsWriter
from echo2.tasks import make_task

log = logging.getLogger("echo2.coordinator")

LIMIT_LOG_S = 10.0
"""How often being at the open-files limit is logged (with the count since)."""
LISTEN_BACKLOG = 4096
"""Connections the kernel queues before the coordinator accepts them (capped by the host's
net.core.somaxconn, 4096 by default on Linux). A fleet connects at once when it joins, when it
leaves at the end of a run and when its news lines reopen after a restart: past aiohttp's default
of 128 the kernel drops their SYNs, which come back only after 1 s, 3 s and 7 s, so 10,000 workers
leaving at once waited about 4 s each for their leave to be read."""


def auth_token(configured: str) -> str:
    token = configured or os.environ.get("ECHO2_AUTH_TOKEN", "")
    if len(token) < 16:
        raise ValueError(
            "auth token missing or shorter than 16 characters: set coordinator.auth_token or $ECHO2_AUTH_TOKEN"
        )
    return token


def open_files_for_a_fleet() -> int:
    """Each worker keeps two connections open (its news line and its requests): the soft limit
    on open files goes up to the hard one. Returns the limit now in force."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft < hard:
        resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
    log.info("open files: up to %d (about %d workers)", hard, hard // 2)
    return hard


class OpenFilesLimit:
    """The event loop's handler for errors no task catches: at the open-files limit asyncio
    pauses accepting for a moment and logs each refused connection with a traceback, thousands
    a second under a large fleet, which costs more than the connections; this says it once
    every LIMIT_LOG_S with a count and the fix, and passes anything else to the default."""

    def __init__(self, limit: int) -> None:
        self.limit, self.refused, self.logged_at = limit, 0, 0.0

    def __call__(self, loop: asyncio.AbstractEventLoop, context: dict) -> None:
        if not str(context.get("message", "")).startswith("socket.accept() out of system resource"):
            loop.default_exception_handler(context)
            return
        self.refused += 1
        if loop.time() - self.logged_at >= LIMIT_LOG_S:
            self.logged_at = loop.time()
            log.warning("at the open-files limit (%d): %d connection attempts waited since the last warning; "
                        "raise the limit (ulimit -n, or LimitNOFILE= for a service) by two per worker",
                        self.limit, self.refused)
            self.refused = 0


async def serve(cfg: RunConfig, stop: asyncio.Event) -> None:
    asyncio.get_running_loop().set_exception_handler(OpenFilesLimit(open_files_for_a_fleet()))
    context = tls.server_context(cfg.tls)  # a bad certificate or key stops us before any state opens
    store = Store(cfg.run_path / "coordinator.db")
    task = make_task(cfg.task, cfg.seed)
    task.check()  # loads and validates the task's data before the first lease needs it
    scorer = make_scorer(task, cfg.base_model_path, cfg.sampling.max_new_tokens)
    state = CoordinatorState(cfg, store, scorer)
    # submissions are scored in processes that build the same scorer from the config (off the
    # event loop, killed when over budget); `scorer` here renders prompts and checks token ids
    scoring = ScoringPool(scorer_recipe(cfg.task, cfg.seed, cfg.base_model_path, cfg.sampling.max_new_tokens),
                          processes=cfg.coordinator.scoring.processes, timeout_s=cfg.coordinator.scoring.timeout_s)
    metrics = MetricsWriter(cfg.run_path / "metrics.jsonl", role="coordinator",
                            segment_bytes=cfg.metrics_segment_bytes)
    secrets = coordinator_secrets(cfg.run_path, auth_token(cfg.coordinator.auth_token),
                                  trusted_workers=trusted_workers_only(cfg.task))
    app = build_app(state, metrics, secrets, max_request_bytes=cfg.coordinator.max_request_bytes,
                    tls_config=cfg.tls, scoring=scoring)
    runner = web.AppRunner(app, access_log=None)
    await runner.setup()
    site = web.TCPSite(runner, cfg.coordinator.host, cfg.coordinator.port, ssl_context=context,
                       backlog=LISTEN_BACKLOG)
    await site.start()
    if context is None:
        tls.warn_plain_bind(cfg.coordinator.host, "the coordinator")
    host, port = runner.addresses[0][:2]
    url = tls.base_url(host, port, tls=context is not None)
    # written whole, then renamed: a launcher or learner polling for it never reads half a file
    written = cfg.run_path / "coordinator.json.tmp"
    written.write_text(json.dumps({"url": url, "pid": os.getpid()}))
    os.replace(written, cfg.run_path / "coordinator.json")
    metrics.write("coordinator_started", url=url)
    scheme = "https" if context is not None else "http"
    # the bind address, not coordinator.json's URL: 0.0.0.0 there reads as 127.0.0.1
    log.info("listening on %s:%s (%s) for run %s (workers: echo2 worker --coordinator %s://HOST:%s, HOST an "
             "address of this machine they can reach)", host, port, scheme, cfg.run_dir, scheme, port)
    try:
        await stop.wait()
    finally:
        await runner.cleanup()
        store.close()
        metrics.close()


def run(cfg: RunConfig) -> int:
    async def main() -> None:
        stop = asyncio.Event()
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(sig, stop.set)
        await serve(cfg, stop)

    asyncio.run(main())
    return 0
