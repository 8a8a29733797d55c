"""The run summary, computed from `metrics.jsonl` alone (so tests and humans read the same
numbers): accuracy before/after, learner utilization, staleness, drops, worker throughput and
weight publish-to-loaded latency.

`summarize` streams the records (`iter_metrics` reads them a line at a time, over every
segment) and keeps only the kinds it reads, so its memory follows the run's steps, versions
and workers, not the size of the file (lease events, worker chatter, bad-peer reports)."""

from __future__ import annotations

from collections import Counter, defaultdict
from collections.abc import Iterable
from typing import Any

from echo2.broadcast.metrics import latency_summary

# the record kinds the summary reads; a kind read with `_of` must be listed here
SUMMARY_KINDS = frozenset({
    "train_step", "checkpoint", "eval", "step_skipped", "version_published", "origin_bytes", "learner_done",
    "coordinator_final", "activation", "weights_loaded", "audit", "worker_quarantined",
    "worker_released", "worker_acquired", "worker_rejoined", "episodes_replayed", "batch_assigned",
    "worker_registered",  # kept only where the worker presented the trusted-worker token (`_kept`)
})


def _of(records: list[dict], kind: str, role: str | None = None) -> list[dict]:
    assert kind in SUMMARY_KINDS, f"summary reads {kind!r} records: add it to SUMMARY_KINDS"
    return [r for r in records if r["kind"] == kind and (role is None or r["role"] == role)]


def _kept(records: Iterable[dict]) -> list[dict]:
    """One pass over `records`: the ones the summary reads, the last coordinator_final, and the
    earliest record of any kind (the run's start, which activation times count from)."""
    kept: list[dict] = []
    final: dict | None = None
    first: dict | None = None
    for r in records:
        if first is None or r["time"] < first["time"]:
            first = r
        if r["kind"] == "coordinator_final":
            final = r  # the last one counts (one per coordinator start; each holds every worker)
        elif r["kind"] in SUMMARY_KINDS and (r["kind"] != "worker_registered" or r.get("trusted")):
            kept.append(r)
    extras = [final] if final else []
    if first is not None and first["kind"] not in SUMMARY_KINDS:
        extras.append(first)  # read by no `_of`: only its time counts
    return kept + extras


def percentiles(values: list[float]) -> dict[str, float]:
    summary = latency_summary(values)  # nearest rank: always a value that was measured
    return {"p50": summary.p50_s or 0.0, "p95": summary.p95_s or 0.0, "max": summary.max_s or 0.0, "n": summary.count}


EVAL_ROLES = ("learner", "coordinator")
"""Who records held-out evaluations: the learner (evaluation.where = "learner") or the
coordinator, which scores evaluation leases."""


def eval_records(records: Iterable[dict]) -> list[dict]:
    """The run's held-out evaluations in version order (the last record of a version wins)."""
    kept = {r["step"]: r for r in records if r["kind"] == "eval" and r.get("role") in EVAL_ROLES}
    return [kept[step] for step in sorted(kept)]


def train_steps(records: list[dict]) -> list[dict]:
    """The learner's step records in step order; a resumed learner re-logs the steps it replays
    from its checkpoint, and the last record of each step wins."""
    return sorted({r["step"]: r for r in _of(records, "train_step", "learner")}.values(), key=lambda r: r["step"])


def step_busy_s(records: list[dict]) -> dict[int, float]:
    """Learner busy seconds per step: training, publishing, and the checkpoint it wrote after."""
    checkpoint_s = {r["step"] - 1: r["checkpoint_s"] for r in _of(records, "checkpoint", "learner")}
    return {s["step"]: s["train_s"] + s["publish_s"] + checkpoint_s.get(s["step"], 0.0) for s in train_steps(records)}


def staleness_mean(hist: dict[str, int]) -> float | None:
    """Mean staleness (step - version) of a step's trained groups, from its `staleness_hist`;
    None for a step without groups."""
    groups = sum(hist.values())
    return sum(int(k) * v for k, v in hist.items()) / groups if groups else None


def utilization(steps: list[dict], busy_s: dict[int, float]) -> float:
    """Share of the learner's step-loop time not spent waiting for data."""
    busy = sum(busy_s[s["step"]] for s in steps)
    wait = sum(s["wait_s"] for s in steps)
    return busy / (busy + wait) if busy + wait > 0 else 0.0


def _dynamic_sampling(counters: dict) -> dict[str, Any]:
    """Groups dropped as uninformative (grpo.drop_uninformative_groups) and their share of the
    scored groups: the d `echo2 plan` takes as workload.uninformative_share; and the completions
    cut off at the length cap (what grpo.overlong_buffer_tokens shapes)."""
    scored, dropped = counters.get("scored", 0), counters.get("dropped_uninformative", 0)
    return {"groups_dropped_uninformative": dropped, "uninformative_share": dropped / scored if scored else None,
            "completions_truncated": counters.get("completions_truncated", 0)}


def summarize(stream: Iterable[dict]) -> dict[str, Any]:
    """The summary of a run's records, read once in order (a list or `iter_metrics(path)`)."""
    records = _kept(stream)
    steps, busy_s = train_steps(records), step_busy_s(records)
    evals = eval_records(records)
    hist: Counter[int] = Counter()
    for s in steps:
        hist.update({int(k): v for k, v in s["staleness_hist"].items()})
    final = _of(records, "coordinator_final")
    counters = final[-1]["counters"] if final else {}
    workers = final[-1]["workers"] if final else {}
    return {
        "steps": len(steps),
        "accuracy_before": evals[0]["accuracy"] if evals else None,
        "accuracy_after": evals[-1]["accuracy"] if evals else None,
        # multi-turn tasks: the in-run evaluation's mean reward (their `accuracy` is the win rate)
        "mean_reward_before": evals[0].get("mean_reward") if evals else None,
        "mean_reward_after": evals[-1].get("mean_reward") if evals else None,
        "replay": _replay(records),
        "learner_utilization": utilization(steps, busy_s),
        # the first step also waits for workers to load the model: report steady state apart
        "learner_utilization_steady": utilization(steps[1:], busy_s),
        "learner_wall_s": (steps[-1]["time"] - steps[0]["time"] + steps[0]["wait_s"]) if steps else 0.0,
        # in-run evaluation on the learner is learner time too: its share says what eval_every and
        # eval_size cost; on workers (evaluation leases) it is worker time the learner never waits on
        "eval_s_total": sum(e.get("eval_s", 0.0) for e in evals if e["role"] == "learner"),
        "eval_worker_s_total": sum(e.get("eval_s", 0.0) for e in evals if e["role"] == "coordinator"),
        "eval_problems": evals[-1].get("problems") if evals else None,
        "evaluations": _evaluations(records, evals),
        "staleness_hist": {str(k): hist[k] for k in sorted(hist)},
        "max_staleness_trained": max(hist) if hist else None,
        **_token_staleness(steps),
        # train.fresh_leases: how many steps ahead workers were let generate, beside the staleness
        "lease_window_steps_mean": _mean_window(records),
        # activation.max_worker_share caps it while other workers deliver (policy/trust.py)
        "max_worker_share_in_batch": _largest_share(records),
        "rollouts_dropped_stale": counters.get("dropped_stale", 0),
        **_dynamic_sampling(counters),
        **_learner_health(records, steps),
        "learner_tokens_per_s": _learner_tokens(steps),
        "leases_requeued": counters.get("leases_expired", 0),
        "workers_lost": counters.get("workers_lost", 0),
        "tokens_per_s": {w: round(v["tokens_per_s"], 1) for w, v in sorted(workers.items())},
        "publish_to_loaded_s": _latency_by_worker(records, "publish_to_loaded_s"),
        "publish_to_verified_s": _latency_by_worker(records, "publish_to_verified_s"),
        "broadcast": _broadcast(records),
        **_cost(final[-1].get("cost") if final else None, len(steps)),
        "activation_decisions": _decisions(records),
        "fleet": _fleet(records),
        "audit": _audit(records, final[-1].get("audit") if final else None),
        # a worker-trusted environment (task.trust): its tool answers, and so its rewards, are theirs
        "rewards_rest_on_workers": sorted({r["worker_id"] for r in _of(records, "worker_registered")}) or None,
    }


def _token_staleness(steps: list[dict]) -> dict[str, Any]:
    """Staleness per trained token (a group that straddled versions is as old as its oldest
    tokens; its later tokens are younger), its p50 and p95, and the tokens masked out of the loss
    as older than S with their share of the model's tokens; and the groups trained whose
    generation straddled versions."""
    hist: Counter[int] = Counter()
    for s in steps:
        hist.update({int(k): v for k, v in s.get("token_staleness_hist", {}).items()})
    masked = sum(s.get("tokens_masked_stale", 0) for s in steps)
    trained = sum(hist.values())
    return {"token_staleness_hist": {str(k): hist[k] for k in sorted(hist)},
            "token_staleness_p50": _percentile(hist, 0.50), "token_staleness_p95": _percentile(hist, 0.95),
            "tokens_masked_stale": masked,
            "masked_token_share": masked / (masked + trained) if masked + trained else None,
            "groups_straddling": sum(s.get("groups_straddling", 0) for s in steps)}


def _percentile(hist: Counter[int], q: float) -> int | None:
    """The smallest staleness with at least a share q of the tokens at or below it."""
    total, seen = sum(hist.values()), 0
    for value in sorted(hist):
        seen += hist[value]
        if seen >= q * total:
            return value
    return None


def _mean_window(records: list[dict]) -> float | None:
    windows = [r["lease_window_steps"] for r in _of(records, "batch_assigned", "coordinator")
               if "lease_window_steps" in r]
    return round(sum(windows) / len(windows), 2) if windows else None


def _largest_share(records: list[dict]) -> float | None:
    """The largest share of one batch's groups any one worker sent (None: not recorded)."""
    shares = [r["max_worker_share"] for r in _of(records, "batch_assigned", "coordinator") if "max_worker_share" in r]
    return max(shares) if shares else None


def _learner_tokens(steps: list[dict]) -> dict[str, float] | None:
    """Tokens the learner's passes computed per second of training, prompt and completion apart
    (a shared prompt counts once); None for runs whose steps do not record them."""
    seconds = sum(s["train_s"] for s in steps if "prompt_tokens_computed" in s)
    if seconds <= 0:
        return None
    prompt = sum(s["prompt_tokens_computed"] for s in steps if "prompt_tokens_computed" in s)
    completion = sum(s["completion_tokens_computed"] for s in steps if "prompt_tokens_computed" in s)
    return {"prompt": round(prompt / seconds, 1), "completion": round(completion / seconds, 1),
            "layout": steps[-1].get("layout")}


def _evaluations(records: list[dict], evals: list[dict]) -> list[dict]:
    """Held-out accuracy per evaluated version, with when (seconds from the run's start) the
    version was published and when its evaluation was recorded: accuracy against wall time."""
    start = min((r["time"] for r in records), default=0.0)
    published = {r["version"]: r["time"] for r in _of(records, "version_published", "learner")}
    return [{"version": e["step"], "accuracy": e["accuracy"], "problems": e.get("problems"),
             "published_s": round(published[e["step"]] - start, 3) if e["step"] in published else None,
             "recorded_s": round(e["time"] - start, 3), "where": "workers" if e["role"] == "coordinator" else "learner"}
            for e in evals]


def _replay(records: list[dict]) -> dict[str, Any] | None:
    """What verifying multi-turn episodes cost the coordinator: episodes replayed, and seconds."""
    replays = _of(records, "episodes_replayed", "coordinator")
    episodes = sum(r["episodes"] for r in replays)
    if not episodes:
        return None
    seconds = sum(r["replay_s"] for r in replays)
    return {"episodes": episodes, "seconds": seconds, "ms_per_episode": 1000 * seconds / episodes}


def _audit(records: list[dict], ledger: dict | None) -> dict[str, Any]:
    """The rollout audit: what the learner checked and failed, who was quarantined and why, and
    per worker the largest difference among groups that passed (its honest noise, what
    audit.max_mean_abs_logprob_diff can be tightened towards)."""
    audits = _of(records, "audit", "learner")
    passed: dict[str, float] = defaultdict(float)
    for a in audits:
        for worker, stats in a["by_worker"].items():
            passed[worker] = max(passed[worker], stats["max_passed_diff"])
    return {
        "groups_audited": sum(a["groups_audited"] for a in audits),
        "groups_recomputed": sum(a["groups_recomputed"] for a in audits),
        "groups_failed": sum(a["groups_failed"] for a in audits),
        "max_passed_diff_by_worker": dict(sorted(passed.items())),
        "quarantined": {r["worker_id"]: r["reason"] for r in _of(records, "worker_quarantined")},
        "ledger": ledger,
    }


def _learner_health(records: list[dict], steps: list[dict]) -> dict[str, Any]:
    """What the learner refused (skipped steps, outlier tokens), what it published, its memory."""
    published = _of(records, "version_published", "learner")
    return {
        "steps_skipped": len(_of(records, "step_skipped", "learner")),
        "log_ratio_outlier_tokens": sum(s.get("log_ratio_outliers", 0) for s in steps),
        # measured: what the manifests say, not params x bytes_per_param. M for `echo2 plan`: the
        # mean over versions after the first (always full); with deltas, join_bytes is the full size
        "bytes_per_version": _mean_bytes(published),
        "full_bytes_per_version": published[-1].get("full_bytes", published[-1]["bytes"]) if published else None,
        "wire_dtype": published[-1].get("wire_dtype") if published else None,
        "learner_peak_memory_bytes": max((s.get("peak_memory_bytes", 0) for s in steps), default=None),
    }


def _mean_bytes(published: list[dict]) -> int | None:
    later = published[1:] or published
    return round(sum(r["bytes"] for r in later) / len(later)) if later else None


def _decisions(records: list[dict]) -> list[dict]:
    """Activation changes while the learner trained (re-plans as workers leave at shutdown are
    not decisions about the run)."""
    done = [r["time"] for r in _of(records, "learner_done")]
    end = done[-1] if done else float("inf")
    start = min((r["time"] for r in records), default=0.0)
    return [
        {"t_s": round(r["time"] - start, 1), "active": r["active"],
         "reason": f"{r['trigger']}: {r['reason']}" if r.get("trigger") else r["reason"]}
        for r in _of(records, "activation") if r["time"] <= end and r.get("changed", True)
    ]


def _cost(cost: dict | None, steps: int) -> dict[str, Any]:
    if not cost:
        return {"cost_total": None, "cost_per_step": None, "cost_by_worker": {}}
    return {
        "s_min_measured": cost.get("s_min_measured"),
        "cost_total": cost["cost_total"],
        "cost_learner": cost["cost_learner"],
        "cost_per_step": cost["cost_total"] / steps if steps else None,
        # rented = active + idle (billed); released time bills nothing
        "cost_by_worker": {w: {"cost": v["cost"], "active_s": v["active_s"], "idle_s": v.get("idle_s", 0.0),
                               "released_s": v.get("released_s", 0.0), "price_per_hour": v["price_per_hour"]}
                           for w, v in cost["workers"].items()},
    }


def _fleet(records: list[dict]) -> dict[str, Any]:
    """What the fleet provider did (launch/fleet.py): releases, acquires, measured rejoin times."""
    return {
        "released": [r["worker_id"] for r in _of(records, "worker_released", "launcher")],
        "acquired": [r["worker_id"] for r in _of(records, "worker_acquired", "launcher")],
        "rejoin_s": percentiles([r["rejoin_s"] for r in _of(records, "worker_rejoined", "launcher")]),
    }


def _latency_by_worker(records: list[dict], field: str) -> dict[str, dict[str, float]]:
    by_worker: dict[str, list[float]] = defaultdict(list)
    for r in _of(records, "weights_loaded"):
        by_worker[r["worker_id"]].append(r[field])
    return {w: percentiles(v) for w, v in sorted(by_worker.items())}


def _broadcast(records: list[dict]) -> dict[str, Any]:
    """What the learner's uplink paid per version (copies of the payload) and what workers relayed."""
    published = _of(records, "version_published", "coordinator")
    origin = _of(records, "origin_bytes", "learner")
    copies = [r["bytes_sent"] / r["total_bytes"] for r in origin if r["total_bytes"]]
    relayed: dict[str, int] = defaultdict(int)
    for r in _of(records, "weights_loaded"):
        relayed[r["worker_id"]] += r.get("bytes_relayed_previous", 0)
    return {
        "mode": published[-1].get("broadcast_mode") if published else None,
        "payload_bytes": origin[-1]["total_bytes"] if origin else None,
        "learner_copies_per_version": sum(copies) / len(copies) if copies else None,
        "bytes_relayed": dict(sorted(relayed.items())),
    }
