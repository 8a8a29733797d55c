"""Which scalars the metric sinks (TensorBoard, W&B) show, read from metrics.jsonl records: one
table, keyed by (role, kind), each entry giving the record's learner step and its values.

The step axis is the number of optimizer steps done (= the policy version): a `train_step`
record of step t is step t+1 done, an `eval` or `checkpoint` of step t is taken after t steps,
a worker's `weights_loaded` of version v and the coordinator's stats at learner step t fall at
v and t. Records without a step (activation changes, stale drops, fleet events) take the
newest step seen. Wall time is each record's own `time`."""

from __future__ import annotations

import math
from collections.abc import Callable

from echo2.report.summary import staleness_mean, utilization

Values = dict[str, float]


def _train_step(r: dict) -> tuple[int, Values]:
    return r["step"] + 1, {
        "train/reward_mean": r["reward_mean"],
        "train/loss": r.get("loss"),
        "train/mismatch_kl": r.get("mismatch_kl"),  # KL(behaviour || current) on the batch
        "train/clip_frac": r.get("clip_frac"),
        "train/ratio_max": r.get("ratio_max"),
        "train/entropy": r.get("entropy"),
        "train/grad_norm": r.get("grad_norm"),
        "train/tokens": r.get("tokens"),
        "staleness/max": r["staleness_max"],
        "staleness/mean": staleness_mean(r["staleness_hist"]),
        "staleness/token_mean": staleness_mean(r.get("token_staleness_hist", {})),
        "train/tokens_masked_stale": r.get("tokens_masked_stale"),
        "learner/wait_s": r["wait_s"],
        "learner/train_s": r["train_s"],
        "learner/publish_s": r["publish_s"],
        "learner/prompt_tokens_per_s": r.get("prompt_tokens_per_s"),
        "learner/completion_tokens_per_s": r.get("completion_tokens_per_s"),
        # this step's share; the summary's figure also counts checkpoint time
        "learner/utilization": utilization([r], {r["step"]: r["train_s"] + r["publish_s"]}),
    }


def _eval(r: dict) -> tuple[int, Values]:
    return r["step"], {"eval/accuracy": r["accuracy"], "eval/mean_reward": r.get("mean_reward"),
                       "eval/eval_s": r.get("eval_s")}


def _weights_loaded(r: dict) -> tuple[int, Values]:
    w = r["worker_id"]
    return r["version"], {
        f"dissemination/publish_to_loaded_s/{w}": r["publish_to_loaded_s"],
        f"dissemination/publish_to_verified_s/{w}": r.get("publish_to_verified_s"),
        # what it forwarded to peers of the version it held before this one
        f"broadcast/relayed_bytes/{w}": r.get("bytes_relayed_previous"),
    }


def _coordinator_stats(r: dict) -> tuple[int, Values]:
    return r["learner_step"], {
        "queue/queued": r["queued"], "queue/leased": r["leased"], "queue/buffered": r["buffered"],
        "workers/alive": r["workers_alive"], "workers/active": r["workers_active"],
        "cost/total_usd": r["cost_total"], "cost/usd_per_hour": r["price_per_hour"],
    }


def _origin_bytes(r: dict) -> tuple[int, Values]:
    copies = r["bytes_sent"] / r["total_bytes"] if r["total_bytes"] else None
    return r["version"], {"broadcast/learner_copies_per_version": copies}


SCALARS: dict[tuple[str, str], Callable[[dict], tuple[int | None, Values]]] = {
    ("learner", "train_step"): _train_step,
    ("learner", "eval"): _eval,
    ("coordinator", "eval"): _eval,  # evaluation leases, scored by the coordinator
    ("learner", "checkpoint"): lambda r: (r["step"], {"learner/checkpoint_s": r["checkpoint_s"]}),
    ("learner", "step_skipped"): lambda r: (r["step"], {"learner/skipped_in_a_row": r["in_a_row"]}),
    ("learner", "audit"): lambda r: (r["step"], {"audit/groups_audited": r["groups_audited"],
                                                 "audit/groups_failed": r["groups_failed"]}),
    ("learner", "version_published"): lambda r: (r["version"], {"broadcast/version_bytes": r["bytes"],
                                                                "broadcast/encode_s": r.get("encode_s")}),
    ("learner", "origin_bytes"): _origin_bytes,
    ("worker", "weights_loaded"): _weights_loaded,
    ("coordinator", "coordinator_stats"): _coordinator_stats,
    ("coordinator", "activation"): lambda r: (None, {"activation/active_workers": len(r["active"]),
                                                     "activation/required_rps": r.get("required_rps")}),
    ("coordinator", "groups_dropped"): lambda r: (r.get("step"), {
        "sampling/groups_uninformative" if r["reason"] == "uninformative" else "staleness/groups_dropped":
            len(r["prompt_indices"])}),
    ("launcher", "worker_rejoined"): lambda r: (None, {"fleet/rejoin_s": r["rejoin_s"]}),
}


def scalars_of(record: dict) -> tuple[int | None, Values] | None:
    """(step or None, {tag: value}) for a record the sinks show, values that are missing or not
    finite left out; None for every other record."""
    entry = SCALARS.get((record.get("role", ""), record.get("kind", "")))
    if entry is None:
        return None
    step, values = entry(record)
    return step, {tag: float(v) for tag, v in values.items()
                  if isinstance(v, int | float) and math.isfinite(v)}
