"""One case's JSON section (`case_section`): latencies and errors by request kind, the
coordinator's evictions, expired leases, stalls and CPU, the learner's pace, and the clients'
own CPU and event-loop lag, over the case's measured window (steady) or before and after the
mass join (mass_join)."""

from __future__ import annotations

from pathlib import Path
from typing import NamedTuple

from load import report
from load.stats import Merged

RECOVERY_WINDOW_S = 30.0
"""Trailing window the mass-join recovery is judged on (steps/min over this many seconds). It
must hold enough steps to resolve the 5% tolerance: at about a step a second a 10 s window
counts in steps of 6/min, so 95% of 60/min took 10 steps in every window, and even the
unharmed 100-worker join never "recovered"; a 30 s window counts in steps of 2/min."""


def case_section(*, plan, run_dir: Path, cfg: dict, samples: dict, workers: Merged, learner: Merged,
                 client_raw: list[dict], client_names: list[str], exits: dict, records: list[dict],
                 step_times: list[float]) -> dict:
    if plan.scenario == "steady":
        seen = Seen(samples, workers, learner, client_names, records, step_times)
        body = _measured(plan, seen, phases=("measure",), window=plan.window, boundaries=("measure", "leave"))
    else:
        body = _mass_join(plan, Seen(samples, workers, learner, client_names, records, step_times))
    body["errors"]["leave"] = report.errors_section(workers, ("leave",)).get("leave", {})
    body["latency_ms"]["leave"] = workers.histogram("leave", ("leave",)).summary()
    # the fleet leaves at the end (over plan.leave_s): the clients' loops lag most then, and a
    # leave they answer late reads as slow (or timed out) whatever the coordinator did
    body["clients"]["loop_lag_ms_leaving"] = report.lag_section(workers, ("leave",))
    return {
        "scenario": plan.scenario, "workers": plan.workers, "run_dir": str(run_dir), **plan.notes,
        "window_s": round(plan.window[1] - plan.window[0], 1),
        **body,
        "top_refusals": report.top_reasons(workers),
        "client_bugs": sum(r.get("bug_count", 0) for r in client_raw),
        "client_bug_samples": [b for r in client_raw for b in r.get("bugs", [])][:5],
        "open_files_limit": max((r.get("open_files_limit", 0) for r in client_raw), default=None),
        "exit_status": exits,
        "coordinator_log": _log_findings(run_dir / "logs" / "coordinator.log"),
        "settings": {"max_staleness": cfg["train"]["max_staleness"],
                     "prompts_per_step": cfg["grpo"]["prompts_per_step"],
                     "group_size": cfg["sampling"]["group_size"],
                     "heartbeat_interval_s": cfg["coordinator"]["heartbeat_interval_s"],
                     "worker_timeout_s": cfg["coordinator"]["worker_timeout_s"],
                     "activation_enabled": cfg["activation"]["enabled"],
                     "drop_uninformative_groups": cfg["grpo"]["drop_uninformative_groups"]},
    }


class Seen(NamedTuple):
    """What a case's processes left, for the sections below."""
    samples: dict
    workers: Merged
    learner: Merged
    client_names: list[str]
    records: list[dict]
    step_times: list[float]


def _measured(plan, seen: Seen, *, phases: tuple[str, ...], window: tuple[float, float],
              boundaries: tuple[str, str]) -> dict:
    """Everything measured over one window (its phases, and the CPU samples at its ends)."""
    workers, learner, names, samples = seen.workers, seen.learner, seen.client_names, seen.samples
    span_s = window[1] - window[0]
    register_phases = ("join",) if plan.scenario == "steady" else ("after",)
    latency = {"register": workers.histogram("register", register_phases).summary(),
               **report.latency_section(workers, report.WORKER_KINDS[2:-1], phases),
               **report.latency_section(learner, report.LEARNER_KINDS, phases)}
    errors = {**report.errors_section(workers, phases), **report.errors_section(learner, phases)}
    errors["register"] = report.errors_section(workers, register_phases).get("register", {})
    cpu = report.cpu_section(samples, ["coordinator", "learner", *names], boundaries, span_s)
    return {
        "latency_ms": latency,
        "errors": errors,
        "deferred": report.deferred_section(workers, (*phases, *register_phases)),
        "requests": report.requests_section(workers, phases),
        "worker_counts": report.worker_counts(workers, phases),
        "coordinator": {**report.coordinator_section(seen.records, window,
                                                     (plan.phases[0][1], plan.last_leave_at + 30.0)),
                        "cpu_s_per_s": cpu.get("coordinator")},
        "learner": {"steps": sum(1 for t in seen.step_times if window[0] <= t <= window[1]),
                    "steps_per_min": report.steps_per_min(seen.step_times, window), "cpu_s_per_s": cpu.get("learner")},
        "clients": {"processes": len(names), "cpu_s_per_s": round(sum(cpu.get(c, 0.0) for c in names), 3),
                    "cpu_s_per_s_by_process": {c: cpu.get(c) for c in names},
                    "loop_lag_ms": report.lag_section(workers, phases)},
        **_sharing(plan, samples, cpu, names, boundaries=boundaries, span_s=span_s),
        "load_average_1m": samples.get(boundaries[1], {}).get("_loadavg_1m"),
    }


def _sharing(plan, samples: dict, cpu: dict, names: list[str], *, boundaries: tuple[str, str], span_s: float) -> dict:
    """How busy each core was, and what other processes and interrupts took of the cores."""
    cores = report.cpu_section(samples, sorted(k for k in samples.get(boundaries[0], {}) if k.startswith("core")),
                               boundaries, span_s)
    mine, theirs = plan.notes.get("coordinator_cores", [0]), plan.notes.get("client_cores", [1])
    return {"cores_busy_s_per_s": cores,
            "others_on_coordinator_cores_s_per_s": _others(cores, mine, [cpu.get("coordinator")]),
            "others_on_client_cores_s_per_s": _others(cores, theirs, [cpu.get(n) for n in ("learner", *names)]),
            "interrupts_on_coordinator_cores_s_per_s": _interrupts(cores, mine)}


def _mass_join(plan, seen: Seen) -> dict:
    before = _measured(plan, seen, phases=("before",), window=plan.before, boundaries=("before", "after"))
    after = _measured(plan, seen, phases=("after",), window=plan.window, boundaries=("after", "leave"))
    pace = before["learner"]["steps_per_min"]
    recovered_s, slowest = report.recovery_s(seen.step_times, plan.window[0], plan.window[1],
                                             before_per_min=pace, window_s=RECOVERY_WINDOW_S)
    over_budget = after["coordinator"]["scoring_over_budget"]
    slow_refusals = sum(n for (k, o, r), n in seen.workers.reasons.items()
                        if k == "rollout" and o == "http_429" and "scoring" in r)
    refused = after["coordinator"]["workers_refused_for_slow_scoring"]
    after["mass_join"] = {
        "joined": plan.workers, "base_workers": plan.notes["base_workers"], "steps_per_min_before": pace,
        "recovery_s": recovered_s, "recovered": recovered_s is not None,
        "slowest_steps_per_min_after": slowest, "recovery_window_s": RECOVERY_WINDOW_S,
        "honest_workers_refused_for_slow_scoring": refused,
        "rollouts_refused_429_for_scoring": slow_refusals, "completions_cut_off_over_budget": over_budget,
        "any_honest_worker_refused_for_slow_scoring": bool(refused or slow_refusals),
    }
    after["before"] = {k: before[k] for k in ("latency_ms", "errors", "coordinator", "learner", "clients")}
    return after


def _others(cores_busy: dict, cores: list[int], ours: list[float | None]) -> float | None:
    """CPU per second spent on `cores` by processes other than `ours` (other users of the
    machine, the harness; interrupts left out): above a few hundredths, the case shared its
    cores."""
    if not cores_busy or any(x is None for x in ours):
        return None
    busy = sum(cores_busy.get(f"core{c}", 0.0) - cores_busy.get(f"core{c}_irq", 0.0) for c in cores)
    return round(max(0.0, busy - sum(ours)), 3)


def _interrupts(cores_busy: dict, cores: list[int]) -> float | None:
    """Interrupt time per second on `cores` (the kernel's loopback packet work lands here)."""
    values = [cores_busy.get(f"core{c}_irq") for c in cores]
    return None if any(v is None for v in values) else round(sum(values), 3)


def _log_findings(path: Path) -> dict:
    """Tracebacks and errors the coordinator logged (e.g. 'Too many open files')."""
    try:
        lines = path.read_text(errors="replace").splitlines()
    except OSError:
        return {}
    errors = [line for line in lines if " ERROR " in line or "Error" in line]
    return {"lines": len(lines), "tracebacks": sum(1 for line in lines if line.startswith("Traceback")),
            "too_many_open_files": sum(1 for line in lines if "Too many open files" in line),
            "error_line_samples": errors[:5]}
