"""The `echo2 sim` summary table: the simulated run next to what `echo2 plan` predicts and what
the centralized baseline costs, one row per question a user asks."""

from __future__ import annotations

import math

from rich.console import Console
from rich.table import Table

from echo2.sim.result import SimResult


def _pct(value: float | None) -> str:
    return "-" if value is None else f"{value:.1%}"


def _money(value: float | None) -> str:
    return "-" if value is None or not math.isfinite(value) else f"${value:,.2f}"


def _small_money(value: float | None) -> str:
    """Four significant digits: a trained group of a small fleet costs fractions of a cent."""
    return "-" if value is None or not math.isfinite(value) else f"${value:.4g}"


def _hours(seconds: float | None) -> str:
    return "-" if seconds is None or not math.isfinite(seconds) else f"{seconds / 3600:.2f} h"


def _seconds(value: float | None) -> str:
    return "-" if value is None or not math.isfinite(value) else f"{value:,.1f} s"


def rows(result: SimResult) -> list[tuple[str, str, str]]:
    """(quantity, simulated, reference) rows; the reference is the planner's prediction or the
    centralized baseline."""
    return _run_rows(result) + _cost_rows(result)


def _uninformative_row(result: SimResult) -> list[tuple[str, str, str]]:
    """With workload.uninformative_share: the groups drawn uninformative and refilled."""
    if not result.uninformative_share:
        return []
    g = result.groups
    return [("groups dropped uninformative", f"{g['dropped_uninformative']} "
             f"({g['dropped_uninformative'] / max(1, g['accepted'] + g['dropped_uninformative']):.1%} of scored)",
             f"workload.uninformative_share: {result.uninformative_share:.1%}")]


def _token_rows(result: SimResult) -> list[tuple[str, str, str]]:
    """With workload.segment_s: how old the trained tokens were and how many were masked."""
    if result.segment_s is None:
        return []
    t, plan = result.tokens, result.plan
    share = t["masked_token_share"]
    return [("tokens: staleness p50 / p95, masked stale",
             f"{t['token_staleness_p50']} / {t['token_staleness_p95']}, {t['tokens_masked_stale']:,} "
             f"({_pct(share)})", f"segment swaps every {result.segment_s:g} s; planner masked: "
             + _pct(plan.get("masked_share")))]


def _run_rows(result: SimResult) -> list[tuple[str, str, str]]:
    """Steps, fleet, time, throughput, staleness and broadcast."""
    plan, base = result.plan, result.baseline
    fleet = ", ".join(f"{n} x {name}" for name, n in result.fleet.items()) or "-"
    g = result.groups
    return [
        (
            "learner steps",
            f"{result.steps_done} of {result.steps_requested}" + ("" if result.finished else " (cut off)"),
            f"centralized: {result.steps_done}",
        ),
        ("fleet rented at start", fleet, "planner's choice" if plan else "every worker"),
        ("wall time", _hours(result.wall_s), "centralized: " + _hours(base.wall_s if base else None)),
        (
            "learner utilization (steady)",
            f"{_pct(result.utilization)} ({_pct(result.utilization_steady)})",
            "planner: " + _pct(plan.get("utilization")),
        ),
        (
            "rollouts/s generated (trained)",
            f"{result.rollouts_per_s:.2f} ({result.trained_rollouts_per_s:.2f})",
            ("needed B/((1-d) T_train): " if result.uninformative_share else "needed B/T_train: ")
            + (f"{plan['base_rps']:.2f}" if plan else "-"),
        ),
        ("groups dropped stale / requeued", f"{g['dropped_stale']} / {g['requeued']} of {g['leased']} leased", ""),
        *_uninformative_row(result),
        ("staleness of trained groups", str(result.staleness_hist), ""),
        *_token_rows(result),
        (
            "broadcast: last worker holds version",
            f"mean {_seconds(result.round_latency_s['mean'])}, max {_seconds(result.round_latency_s['max'])}",
            "planner T_dis: " + _seconds(plan.get("dissemination_s")),
        ),
        (
            "publish -> loaded, per worker",
            f"p50 {_seconds(result.publish_to_loaded_s['p50'])}, "
            f"p95 {_seconds(result.publish_to_loaded_s['p95'])}",
            "",
        ),
    ]


def _cost_rows(result: SimResult) -> list[tuple[str, str, str]]:
    """Fleet changes, worker-hours, cost and the saving against the centralized baseline."""
    plan, base = result.plan, result.baseline
    return [
        ("preemptions / activation changes", f"{result.preemptions} / {result.controller_switches}", ""),
        ("worker-hours active / idle / released",
         " / ".join(f"{result.fleet_time_h[k]:,.1f}" for k in ("active", "idle", "released")),
         f"releases {result.releases}, acquires {result.acquires}"),
        ("cost: learner + fleet", f"{_money(result.learner_cost)} + {_money(result.fleet_cost)}", ""),
        ("fleet billed $/step, $/trained group",
         f"{_small_money(result.billed_usd_per_step)}, {_small_money(result.billed_usd_per_group)}",
         f"{result.billed_s / 3600:,.1f} machine-h, acquire to release, boot included"),
        ("total cost", _money(result.total_cost), "centralized: " + _money(base.cost if base else None)),
        (
            "$ per step",
            _money(result.cost_per_step),
            "planner: "
            + _money(plan.get("cost_per_step"))
            + "; centralized: "
            + _money(base.cost / result.steps_done if base and result.steps_done else None),
        ),
        (
            "saving vs centralized",
            _pct(result.saving_fraction),
            "planner: " + _pct(plan.get("saving_fraction")) + "; paper: 33-36%",
        ),
        ("simulation", f"{result.events:,} events in {result.run_s:.2f} s", ""),
    ]


def render(result: SimResult, console: Console) -> None:
    title = f"echo2 sim {result.scenario}: {result.model}" if result.model else f"echo2 sim {result.scenario}"
    table = Table(title=title, title_justify="left")
    for column in ("quantity", "simulated", "reference"):
        table.add_column(column)
    for row in rows(result):
        table.add_row(*row)
    console.print(table)
