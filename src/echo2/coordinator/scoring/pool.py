"""Scoring off the coordinator's event loop: a small pool of processes it starts, owns and can
kill (`python -m echo2.coordinator.scoring.child`, each building its own scorer from a JSON
recipe: nothing is pickled either way). Each completion is one job, scored by whichever process
is free, within `timeout_s` (coordinator.scoring.timeout_s) of that process's own CPU time:
the coordinator's event loop stalling, or other processes on its core, never count against a
job. A job past its budget, or whose process dies, is `OverBudget` (it scores 0): its process is
killed by pid, reaped, and a fresh one started in its place. `stop` kills and reaps every
process the pool started.

Why processes and not threads: a thread stuck in sympy cannot be stopped, and holds the GIL the
event loop needs. Why not concurrent.futures: it cannot kill one task."""

from __future__ import annotations

import asyncio
import json
import logging
import os
import sys
import time
from collections import deque
from collections.abc import Callable
from contextlib import suppress
from pathlib import Path

from echo2.coordinator.scoring.jobs import Mismatch, Outcome, OverBudget

log = logging.getLogger("echo2.coordinator")

CHILD = "echo2.coordinator.scoring.child"
START_TIMEOUT_S = 300.0
"""A process that has not built its scorer by then (its task's data loaded) is killed and
started again."""
RESTART_PAUSES_S = (1.0, 30.0)
"""After a process fails to start, the next try waits the first pause, doubling up to the last."""
KILLED_KEPT = 256
CPU_CHECK_S = 0.1
"""How often a running job's CPU time is read: a job cut off spends at most this past its budget."""
WALL_BUDGETS = 10
"""A job that has neither answered nor used its budget of CPU after this many budgets of waiting
is stuck without computing (blocked): it is cut off too."""


class _OverBudget(Exception):
    """A job past its budget (the message says how)."""


def cpu_seconds(pid: int) -> float | None:
    """User + system CPU seconds of process `pid` so far (Linux /proc; None elsewhere)."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rpartition(")")[2].split()
    except OSError:
        return None
    return (int(fields[11]) + int(fields[12])) / _CLOCK_TICKS_PER_S  # utime, stime (fields 14, 15)


_CLOCK_TICKS_PER_S = os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 100


class ScoringError(RuntimeError):
    """A scorer raised (a bug, not the worker's doing), or the pool is stopping."""


class ScoringPool:
    def __init__(self, recipe: dict, *, processes: int, timeout_s: float,
                 start_timeout_s: float = START_TIMEOUT_S) -> None:
        """`recipe`: how a process builds its scorer (echo2.coordinator.scoring.scorer.scorer_recipe)."""
        if processes < 1 or not timeout_s > 0:
            raise ValueError(f"a scoring pool needs processes >= 1 and timeout_s > 0 (got {processes}, {timeout_s})")
        self.recipe, self.processes, self.timeout_s = recipe, processes, timeout_s
        self.start_timeout_s = start_timeout_s
        self.idle: asyncio.Queue[asyncio.subprocess.Process] | None = None  # made on the loop, in start()
        self.children: dict[int, asyncio.subprocess.Process] = {}
        """Every process started and not yet reaped, by pid (idle, busy or still starting)."""
        self.background: set[asyncio.Task] = set()
        self.killed: deque[int] = deque(maxlen=KILLED_KEPT)
        """Pids killed (and reaped) for a job past its budget or a dead process, oldest first."""
        self.closed = False

    async def start(self) -> None:
        """Start the processes in the background: each builds and warms its scorer (seconds);
        the first jobs wait for the first one ready, the coordinator's start does not."""
        self.idle = asyncio.Queue()
        for _ in range(self.processes):
            self._later(self._keep_one())

    async def wait_ready(self, timeout_s: float) -> None:
        """Until every process is started and idle (tests; TimeoutError past `timeout_s`)."""
        async with asyncio.timeout(timeout_s):
            while self.idle is None or self.idle.qsize() < self.processes:
                await asyncio.sleep(0.05)

    async def score(self, jobs: list[dict], give_up_after: int | None = None) -> list[Outcome]:
        """Each job's outcome, the jobs spread over the free processes (in order of asking).
        `give_up_after`: once this many of these jobs are cut off, the ones not started yet are
        not run (`OverBudget`, pid 0): one worker's submission costs at most that many budgets."""
        cut_off: list[Outcome] = []

        def enough() -> bool:
            return give_up_after is not None and len(cut_off) >= give_up_after

        async def one(job: dict) -> Outcome:
            outcome = await self._one(job, enough)
            if isinstance(outcome, OverBudget):
                cut_off.append(outcome)
            return outcome

        return list(await asyncio.gather(*(one(job) for job in jobs)))

    async def stop(self) -> None:
        """Kill and reap every process (by pid), those still starting included."""
        self.closed = True
        for task in list(self.background):
            task.cancel()
        await asyncio.gather(*list(self.background), return_exceptions=True)
        for proc in list(self.children.values()):
            await self._reap(proc)

    async def _one(self, job: dict, enough: Callable[[], bool]) -> Outcome:
        if self.closed or self.idle is None:
            raise ScoringError("the scoring pool is not running (the coordinator is starting or stopping)")
        proc = await self.idle.get()
        if enough():
            self.idle.put_nowait(proc)
            return OverBudget(reason="not scored: other completions of its submission ran over budget")
        try:
            reply = await self._within_budget(proc, (json.dumps(job) + "\n").encode())
        except _OverBudget as over:
            return await self._cut_off(proc, str(over))
        except ConnectionError:
            reply = b""
        except BaseException:  # cancelled mid-job: its late reply would answer the next job
            self._later(self._cut_off(proc, "cancelled"))
            raise
        if not reply:
            return await self._cut_off(proc, "its scoring process died")
        self.idle.put_nowait(proc)
        answer = json.loads(reply)
        if "error" in answer:
            raise ScoringError(f"the scorer failed: {answer['error']}")
        if float(answer.get("cpu_s", 0.0)) > self.timeout_s:  # finished, but past its budget: it still counts
            return OverBudget(reason=self._over(float(answer["cpu_s"])), pid=proc.pid)
        return Mismatch(answer["mismatch"]) if "mismatch" in answer else float(answer["value"])

    async def _within_budget(self, proc: asyncio.subprocess.Process, line: bytes) -> bytes:
        """The job's reply, waited for in slices; between slices the process's own CPU time on
        the job is read (/proc), and past the budget the job is cut off (`_OverBudget`). The
        event loop's stalls and other processes on the core never count against the job. A job
        that uses no CPU and never answers (a deadlock) is cut off at WALL_BUDGETS budgets."""
        started_cpu_s, started = cpu_seconds(proc.pid), time.monotonic()
        reply = asyncio.ensure_future(self._ask(proc, line))
        try:
            while True:
                done, _ = await asyncio.wait({reply}, timeout=CPU_CHECK_S)
                if done:
                    return reply.result()
                used_s = cpu_seconds(proc.pid) - started_cpu_s if started_cpu_s is not None else None
                if used_s is None:  # no /proc here: the time waited is all there is to go by
                    used_s = time.monotonic() - started
                if used_s > self.timeout_s:
                    raise _OverBudget(self._over(used_s))
                if time.monotonic() - started > WALL_BUDGETS * self.timeout_s:
                    raise _OverBudget(f"no answer after {WALL_BUDGETS} x coordinator.scoring.timeout_s of waiting")
        finally:
            if not reply.done():
                reply.cancel()

    @staticmethod
    async def _ask(proc: asyncio.subprocess.Process, line: bytes) -> bytes:
        proc.stdin.write(line)
        await proc.stdin.drain()
        return await proc.stdout.readline()

    def _over(self, used_s: float) -> str:
        return f"scoring took {used_s:.2f} s of CPU, over coordinator.scoring.timeout_s={self.timeout_s:g} s"

    async def _cut_off(self, proc: asyncio.subprocess.Process, reason: str) -> OverBudget:
        pid = proc.pid
        await self._reap(proc)
        self.killed.append(pid)
        log.warning("scoring process %d killed: %s; starting another", pid, reason)
        if not self.closed:
            self._later(self._keep_one())
        return OverBudget(reason=reason, pid=pid)

    def _later(self, coroutine) -> None:
        task = asyncio.get_running_loop().create_task(coroutine)
        self.background.add(task)
        task.add_done_callback(self.background.discard)

    async def _keep_one(self) -> None:
        """Start one process and make it idle; after a failed start, try again later."""
        pause = RESTART_PAUSES_S[0]
        while not self.closed:
            proc = await self._spawn()
            if proc is not None:
                self.idle.put_nowait(proc)
                return
            log.error("a scoring process failed to start (its error is above); trying again in %.0f s", pause)
            await asyncio.sleep(pause)
            pause = min(2 * pause, RESTART_PAUSES_S[1])

    async def _spawn(self) -> asyncio.subprocess.Process | None:
        proc = await asyncio.create_subprocess_exec(sys.executable, "-m", CHILD, stdin=asyncio.subprocess.PIPE,
                                                    stdout=asyncio.subprocess.PIPE, env=_child_env())
        self.children[proc.pid] = proc  # from here on stop() kills it, whatever happens below
        try:
            proc.stdin.write((json.dumps(self.recipe) + "\n").encode())
            line = await asyncio.wait_for(proc.stdout.readline(), self.start_timeout_s)
            ready = json.loads(line).get("ready") if line else None
        except (TimeoutError, ConnectionError, ValueError, AttributeError):
            ready = None
        if ready == proc.pid:
            return proc
        await self._reap(proc)
        return None

    async def _reap(self, proc: asyncio.subprocess.Process) -> None:
        if proc.returncode is None:
            with suppress(ProcessLookupError):
                proc.kill()  # SIGKILL to its pid: a process stuck in C code ignores anything gentler
        if proc.stdin is not None:
            proc.stdin.close()
        await proc.wait()
        self.children.pop(proc.pid, None)


def _child_env() -> dict[str, str]:
    """The coordinator's environment, its import path included (so a process finds the modules
    the coordinator was started with, a test's scorer among them)."""
    path = os.pathsep.join(p for p in sys.path if p)
    return dict(os.environ, PYTHONPATH=path, TOKENIZERS_PARALLELISM="false")
