"""A scoring process of the coordinator's pool (echo2.coordinator.scoring.pool), run as
`python -m echo2.coordinator.scoring.child`. It reads its recipe (one JSON line: `factory`,
"module:function", called with `kwargs`), builds and warms its scorer, answers
{"ready": <pid>}, then scores one job per line of stdin (echo2.coordinator.scoring.jobs), one
JSON line of reply each: {"value": x, "cpu_s": s}, {"mismatch": why, "cpu_s": s} or
{"error": what}. It exits at the end of stdin, and on Linux when the coordinator dies; the pool
kills it when a job spends more than its budget of this process's CPU time.

Everything on the pipe is JSON written by the coordinator's own code: nothing is unpickled."""

from __future__ import annotations

import importlib
import json
import os
import signal
import sys
import time

from echo2.coordinator.scoring.jobs import Mismatch, score_job


def build(recipe: dict):
    module, _, name = recipe["factory"].partition(":")
    scorer = getattr(importlib.import_module(module), name)(**recipe["kwargs"])
    scorer.warm()
    return scorer


def reply_to(scorer, line: str) -> dict:
    """The job's outcome and the CPU seconds this process spent on it (`cpu_s`): the budget is
    the scoring's own time, whatever else the machine or the coordinator's loop was doing."""
    started = time.process_time()
    try:
        outcome = score_job(scorer, json.loads(line))
    except Exception as exc:  # noqa: BLE001  a bug in a scorer: the coordinator answers 500 and logs it
        return {"error": f"{type(exc).__name__}: {exc}"[:2000]}
    cpu_s = time.process_time() - started
    if isinstance(outcome, Mismatch):
        return {"mismatch": outcome.reason[:2000], "cpu_s": cpu_s}
    return {"value": outcome, "cpu_s": cpu_s}


def die_with_the_coordinator() -> None:
    """On Linux, be killed when the coordinator dies, even in the middle of a job (at the end of
    stdin is not soon enough for a process stuck in sympy); elsewhere, the end of stdin only."""
    parent = os.getppid()
    try:
        import ctypes

        ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG
    except (OSError, AttributeError):
        return
    if os.getppid() != parent:  # it died before we asked
        os._exit(1)


def main() -> None:
    die_with_the_coordinator()
    # the coordinator stops its children itself (by pid); Ctrl-C in its terminal is for it
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    # replies go to a copy of stdout; whatever a library prints lands on stderr, not in the protocol
    replies = os.fdopen(os.dup(sys.stdout.fileno()), "w", buffering=1)
    os.dup2(sys.stderr.fileno(), sys.stdout.fileno())
    scorer = build(json.loads(sys.stdin.readline()))
    replies.write(json.dumps({"ready": os.getpid()}) + "\n")
    for line in sys.stdin:
        replies.write(json.dumps(reply_to(scorer, line)) + "\n")


if __name__ == "__main__":
    main()
