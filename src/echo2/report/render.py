"""Render the run summary as rich tables for the terminal."""

from __future__ import annotations

from typing import Any

from rich.console import Console
from rich.table import Table


def _versions(evals: list[dict]) -> str:
    shown = [f"{e['version']}: {e['accuracy']:.3f}" for e in evals]
    return ", ".join(shown if len(shown) <= 6 else [*shown[:3], "...", *shown[-2:]])


def _fmt(value: Any) -> str:
    if value is None:
        return "-"
    if isinstance(value, float):
        return f"{value:.3f}"
    return str(value)


def render_summary(summary: dict[str, Any], console: Console) -> None:
    console.print(_metrics_table(summary))
    decisions = summary.get("activation_decisions", [])
    if decisions:
        changes = Table(title="cost-aware activation (changes while training)")
        for column in ("t s", "active workers", "why"):
            changes.add_column(column)
        for d in decisions:
            changes.add_row(f"{d['t_s']:.1f}", ", ".join(d["active"]), d["reason"])
        console.print(changes)
    console.print(_workers_table(summary))
    fleet = summary.get("fleet") or {}
    if fleet.get("released") or fleet.get("acquired"):
        rejoin = fleet["rejoin_s"]
        rejoined = f"{rejoin['p50']:.1f}/{rejoin['max']:.1f} s" if rejoin["n"] else "-"
        console.print(f"fleet: released {', '.join(fleet['released']) or '-'}; acquired "
                      f"{', '.join(fleet['acquired']) or '-'}; rejoin p50/max {rejoined}")
    if fleet.get("billed_usd") is not None:
        per_step, per_group = fleet.get("billed_usd_per_step"), fleet.get("billed_usd_per_group")
        console.print(f"fleet billed ${fleet['billed_usd']:.4f} over {fleet['billed_s']:.0f} machine-s, boot included "
                      f"(${'-' if per_step is None else f'{per_step:.4g}'}/step, "
                      f"${'-' if per_group is None else f'{per_group:.4g}'}/group)"
                      + (f"; still held: {', '.join(fleet['held_at_end'])}" if fleet["held_at_end"] else ""))


def _metrics_table(summary: dict[str, Any]) -> Table:
    table = Table(title="echo2 run summary", show_header=False)
    table.add_column("metric")
    table.add_column("value")
    before, after = summary["accuracy_before"], summary["accuracy_after"]
    table.add_row("learner steps", _fmt(summary["steps"]))
    if summary.get("mean_reward_before") is not None:
        table.add_row("held-out mean reward before -> after",
                      f"{_fmt(summary['mean_reward_before'])} -> {_fmt(summary['mean_reward_after'])}")
        table.add_row("held-out win rate before -> after", f"{_fmt(before)} -> {_fmt(after)}")
    else:
        table.add_row("held-out accuracy before -> after", f"{_fmt(before)} -> {_fmt(after)}")
    replay = summary.get("replay")
    if replay:
        table.add_row("episodes replayed by the coordinator", f"{replay['episodes']:,} in {replay['seconds']:.1f} s "
                      f"({replay['ms_per_episode']:.2f} ms per episode)")
    trusted = summary.get("rewards_rest_on_workers")
    if trusted:
        table.add_row("rewards rest on (worker-trusted tool answers)", ", ".join(trusted))
    if summary.get("eval_s_total"):
        table.add_row("evaluation (learner time)", f"{summary['eval_s_total']:.1f} s on {summary['eval_problems']} "
                      f"held-out problems per evaluation")
    on_workers = [e for e in summary.get("evaluations", []) if e["where"] == "workers"]
    if on_workers:
        table.add_row("evaluation (on workers)", f"{len(on_workers)} versions ({_versions(on_workers)}), "
                      f"{summary['eval_worker_s_total']:.1f} s of worker time on {summary['eval_problems']} held-out "
                      "problems each; the learner never waits for it")
    tokens = summary.get("learner_tokens_per_s")
    if tokens:
        table.add_row("learner tokens/s (prompt / completion)",
                      f"{tokens['prompt']:,.0f} / {tokens['completion']:,.0f} ({tokens['layout']} passes)")
    table.add_row("learner utilization (steady)",
                  f"{summary['learner_utilization']:.1%} ({summary['learner_utilization_steady']:.1%})")
    window = summary.get("lease_window_steps_mean")
    table.add_row("staleness of trained groups", _fmt(summary["staleness_hist"]) + (
        f"; leased {window:.2f} steps ahead on average" if window is not None else ""))
    if summary.get("token_staleness_p50") is not None:
        masked = summary.get("masked_token_share") or 0.0
        table.add_row("staleness of trained tokens", f"p50 {summary['token_staleness_p50']}, p95 "
                      f"{summary['token_staleness_p95']}; {summary['tokens_masked_stale']:,} tokens masked as older "
                      f"than S ({masked:.1%})")
    share = summary.get("max_worker_share_in_batch")
    if share is not None:
        table.add_row("largest share of a batch from one worker", f"{share:.0%}")
    if summary.get("s_min_measured") is not None:
        table.add_row("S_min from measured latencies", _fmt(summary["s_min_measured"]))
    _add_data_rows(table, summary)
    _add_system_rows(table, summary)
    return table


def _add_data_rows(table: Table, summary: dict[str, Any]) -> None:
    """What happened to the rollouts: dropped, requeued, skipped, audited."""
    table.add_row("rollouts dropped (stale)", _fmt(summary["rollouts_dropped_stale"]))
    share = summary.get("uninformative_share")
    if share is not None:
        table.add_row("groups dropped (uninformative: rewards all equal)",
                      f"{summary['groups_dropped_uninformative']} ({share:.1%} of scored)")
    if summary.get("completions_truncated"):
        table.add_row("completions cut off at max_new_tokens", _fmt(summary["completions_truncated"]))
    table.add_row("leases requeued / workers lost", f"{summary['leases_requeued']} / {summary['workers_lost']}")
    if summary.get("steps_skipped") or summary.get("log_ratio_outlier_tokens"):
        table.add_row("steps skipped (non-finite) / outlier tokens left out",
                      f"{summary['steps_skipped']} / {summary['log_ratio_outlier_tokens']}")
    audit = summary.get("audit") or {}
    if audit.get("groups_audited"):
        table.add_row("rollout audit: groups checked (recomputed) / failed",
                      f"{audit['groups_audited']} ({audit['groups_recomputed']}) / {audit['groups_failed']}")
    for worker, reason in (audit.get("quarantined") or {}).items():
        table.add_row(f"quarantined: {worker}", reason)


def _add_system_rows(table: Table, summary: dict[str, Any]) -> None:
    """Weights, memory, broadcast, cost and plots."""
    if summary.get("bytes_per_version"):
        table.add_row("bytes per version (wire dtype)", f"{summary['bytes_per_version']:,} ({summary['wire_dtype']})")
    if summary.get("learner_peak_memory_bytes"):
        table.add_row("learner peak memory", f"{summary['learner_peak_memory_bytes'] / 2**30:.2f} GiB")
    cast = summary.get("broadcast") or {}
    if cast.get("mode"):
        copies = cast.get("learner_copies_per_version")
        table.add_row("weight broadcast", f"{cast['mode']}; learner sent {_fmt(copies)} copies per version "
                      f"of {cast['payload_bytes'] or 0:,} bytes")
    if summary.get("cost_total") is not None:
        table.add_row("cost total ($/step)", f"${summary['cost_total']:.4f} (${_fmt(summary['cost_per_step'])})")
    if summary.get("plots"):
        table.add_row("plots (in the run dir)", "\n".join(summary["plots"]))


def _workers_table(summary: dict[str, Any]) -> Table:
    cast = summary.get("broadcast") or {}
    workers = Table(title="workers (dissemination = publish -> verified / -> loaded, seconds)")
    for column in ("worker", "tokens/s", "verified p50/p95/max", "loaded p50/p95/max", "versions",
                   "relayed MB", "$/h", "active s", "idle s", "released s", "$"):
        workers.add_column(column)
    loaded, verified = summary["publish_to_loaded_s"], summary.get("publish_to_verified_s", {})
    relayed, cost = cast.get("bytes_relayed", {}), summary.get("cost_by_worker", {})
    for worker in sorted(set(summary["tokens_per_s"]) | set(loaded) | set(cost)):
        bill = cost.get(worker, {})
        workers.add_row(
            worker, f"{summary['tokens_per_s'].get(worker, 0):.0f}", _spread(verified.get(worker)),
            _spread(loaded.get(worker)), str((loaded.get(worker) or {}).get("n", 0)),
            f"{relayed.get(worker, 0) / 1e6:.1f}", f"{bill.get('price_per_hour') or 0:.2f}",
            f"{bill.get('active_s') or 0:.0f}", f"{bill.get('idle_s') or 0:.0f}", f"{bill.get('released_s') or 0:.0f}",
            f"{bill.get('cost') or 0:.4f}",
        )
    return workers


def _spread(lat: dict | None) -> str:
    return "-" if not lat or not lat.get("n") else f"{lat['p50']:.2f}/{lat['p95']:.2f}/{lat['max']:.2f}"
