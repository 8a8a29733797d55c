"""LLM judges of verifiers environments, kept on the side that can be trusted. A verifiers task
plugs judges into its config (`TaskConfig.judges`, run by `Task.score` after its own rewards);
each calls an OpenAI-compatible endpoint. In echo2 the reward that counts is computed at the
coordinator (and by the learner's evaluation), so only there do the judges run, against the
endpoint of `[task.judge]`. Workers play with the judges taken out: their rewards are never
used, and an untrusted worker gets neither the endpoint nor its key. An environment with
judges and no `[task.judge]` is refused before the run starts."""

from __future__ import annotations

import copy
from collections.abc import Sequence

from echo2.config.task import JudgeEndpoint

CONNECT_TIMEOUT_S = 10.0


def plugged_judges(tasks: Sequence) -> list[str]:
    """The ids of the judges the tasks plug (each once, in order of first use)."""
    seen: dict[str, None] = {}
    for task in tasks:
        for judge in getattr(task.config, "judges", None) or ():
            seen.setdefault(judge.id or type(judge).__name__, None)
    return list(seen)


def missing_endpoint(tasks: Sequence, environment: str, judge: JudgeEndpoint | None) -> str | None:
    """What is wrong, naming the judges and the fix, when the tasks plug judges and `judge` is None."""
    judges = plugged_judges(tasks)
    if not judges or judge is not None:
        return None
    return (f"task.environment = {environment!r} scores with LLM judges ({', '.join(judges)}): set [task.judge] "
            "base_url and model, an OpenAI-compatible endpoint that the coordinator and the learner call (workers "
            "never do); its key goes in the variable named by task.judge.api_key_var")


def judged_tasks(tasks: list, judge: JudgeEndpoint | None, *, run_judges: bool) -> list:
    """`tasks` with each plugged judge pointed at `judge` (`run_judges`: the coordinator's and
    the learner's side), or taken out (a worker's side). Tasks without judges are the same
    objects; the others are copies, so a process that plays both sides keeps each its own."""
    out = []
    for task in tasks:
        judges = getattr(task.config, "judges", None)
        if not judges:
            out.append(task)
            continue
        kept = [_pointed(j, judge) for j in judges] if run_judges and judge is not None else []
        changed = copy.copy(task)
        changed.config = task.config.model_copy(update={"judges": kept})
        out.append(changed)
    return out


def _pointed(config, judge: JudgeEndpoint):
    timeout = config.timeout.model_copy(update={"connect": min(CONNECT_TIMEOUT_S, judge.timeout_s),
                                                "read": judge.timeout_s, "write": judge.timeout_s,
                                                "pool": judge.timeout_s})
    return config.model_copy(update={"base_url": judge.base_url, "model": judge.model,
                                     "api_key_var": judge.api_key_var, "timeout": timeout})


__all__ = ["judged_tasks", "missing_endpoint", "plugged_judges"]
