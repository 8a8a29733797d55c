"""A client process of the load benchmark: many simulated workers (load.sim_worker) on one
asyncio loop, each joining and leaving at its own time (it sends its leave then). Also ticks
to measure its own event-loop lag, so a result limited by the client shows.
Raises RLIMIT_NOFILE to the hard limit first (a worker holds up to three connections). Writes its
Recorder and a few counts to `out` when done.

    python benchmarks/load/client.py CONFIG.json

CONFIG: url, join_token, tokenizer (a tokenizer.json), phases [[name, wall time]], settings
(SimSettings fields but url/join_token), workers [[index, worker id, source address, join at,
leave at (wall times)]], out."""

from __future__ import annotations

import asyncio
import gc
import json
import signal
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from echo2.protocol.messages import PROTOCOL_VERSION  # noqa: E402
from echo2.rollout.waits import wait_either  # noqa: E402
from load.answers import AnswerBook  # noqa: E402
from load.processes import raise_open_files_limit  # noqa: E402
from load.sim_worker import SPEAKS_PROTOCOL, SimSettings, SimWorker, watch_news_lines  # noqa: E402
from load.stats import Recorder, lag_ticker  # noqa: E402


def sim_settings(cfg: dict) -> SimSettings:
    extra = {k: tuple(v) if isinstance(v, list) else v for k, v in cfg.get("settings", {}).items()}
    return SimSettings(url=cfg["url"].rstrip("/"), join_token=cfg["join_token"], **extra)


async def run_workers(cfg: dict, recorder: Recorder, stop: asyncio.Event) -> list[BaseException]:
    """Every worker of `cfg`, each from its join time to its leave time (or `stop`, a signal),
    then `stop` is set; the exceptions that escaped any of them (a bug in the simulation, not
    the coordinator's doing)."""
    settings, answers = sim_settings(cfg), AnswerBook(Path(cfg["tokenizer"]))
    loop = asyncio.get_running_loop()
    leaving = [asyncio.Event() for _ in cfg["workers"]]

    async def one(mine: asyncio.Event, index: int, name: str, source_ip: str, join_at: float, leave_at: float) -> None:
        loop.call_later(max(0.0, leave_at - time.time()), mine.set)
        await asyncio.sleep(max(0.0, join_at - time.time()))
        if not mine.is_set():
            await SimWorker(index, name, source_ip, settings, recorder=recorder, answers=answers).run(mine)

    async def on_signal() -> None:
        await stop.wait()
        for mine in leaving:
            mine.set()

    signalled = asyncio.create_task(on_signal())
    results = await asyncio.gather(*(one(mine, *w) for mine, w in zip(leaving, cfg["workers"], strict=True)),
                                   return_exceptions=True)
    stop.set()
    await signalled
    return [r for r in results if isinstance(r, BaseException)]


async def freeze_survivors(stop: asyncio.Event) -> None:
    """What survives each full garbage collection is frozen (as the coordinator does,
    coordinator/http/upkeep.py): thousands of simulated workers keep a million objects alive,
    and a full pass over them would stall this client for a second."""
    full_passes: list[int] = []

    def passed(phase: str, info: dict) -> None:
        if phase == "stop" and info.get("generation") == 2:
            full_passes.append(1)

    gc.callbacks.append(passed)
    try:
        while not stop.is_set():
            await wait_either(stop, stop, timeout_s=1.0)
            if full_passes:
                full_passes.clear()
                gc.freeze()
    finally:
        gc.callbacks.remove(passed)


async def _main(cfg: dict) -> dict:
    if PROTOCOL_VERSION != SPEAKS_PROTOCOL:
        raise SystemExit(f"the coordinator speaks protocol {PROTOCOL_VERSION}, the simulated worker {SPEAKS_PROTOCOL}: "
                         "update benchmarks/load/sim_worker.py to the new protocol")
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    recorder = Recorder([(name, at) for name, at in cfg["phases"]])
    left = asyncio.Event()  # every worker has left (or given up): the lag is measured until then
    ticker = asyncio.create_task(lag_ticker(recorder, left))
    watch = asyncio.create_task(watch_news_lines(stop))
    freezer = asyncio.create_task(freeze_survivors(stop))
    errors = await run_workers(cfg, recorder, stop)
    left.set()
    await asyncio.gather(ticker, watch, freezer)
    return {"recorder": recorder.to_dict(), "workers": len(cfg["workers"]),
            "bugs": [f"{type(e).__name__}: {e}"[:500] for e in errors[:20]], "bug_count": len(errors)}


def main(path: str) -> None:
    cfg = json.loads(Path(path).read_text())
    limit = raise_open_files_limit()
    result = asyncio.run(_main(cfg))
    result["open_files_limit"] = limit
    Path(cfg["out"]).write_text(json.dumps(result))


if __name__ == "__main__":
    main(sys.argv[1])
