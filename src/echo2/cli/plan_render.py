"""Human-readable rendering of a provisioning plan (rich tables) for `echo2 plan`."""

from __future__ import annotations

import math

from rich.console import Console
from rich.table import Table

from echo2.planner.plan import Plan


def _num(value: float | None, digits: int = 3) -> str:
    if value is None or not math.isfinite(value):
        return "-"
    return f"{value:.{digits}g}" if abs(value) < 10**digits else f"{value:,.0f}"


def _money(value: float | None) -> str:
    if value is None or not math.isfinite(value):
        return "-"
    return f"${value:,.2f}" if value >= 0.1 or value == 0 else f"${value:.5f}"


def _header(plan: Plan) -> str:
    status = "[green]feasible[/]" if plan.feasible else "[bold red]INFEASIBLE[/]"
    return (
        f"[bold]echo2 plan[/] {plan.model}: B={plan.batch_rollouts} rollouts/step, "
        f"T_train={_num(plan.step_time_s)} s, S={plan.max_staleness}, "
        f"{plan.snapshot_bytes / 1e9:.1f} GB/version, topology={plan.topology}: {status}"
    )


def _classes(plan: Plan) -> Table:
    table = Table(title="worker classes (latencies at the chosen fleet size)", title_justify="left")
    for column in (
        "class",
        "avail",
        "chosen",
        "$/h each",
        "rollouts/s",
        "admissible/s",
        "T_dis s",
        "T_gen s",
        "tail s",
        "S_min",
        "NAT",
    ):
        table.add_column(column, justify="left" if column == "class" else "right")
    for c in plan.classes:
        style = "bold" if c.chosen else ("dim" if c.admissible_rps == 0 else None)
        table.add_row(
            c.name,
            str(c.available),
            str(c.chosen),
            f"{c.price_per_hour:.2f}",
            _num(c.rollouts_per_s),
            _num(c.admissible_rps),
            _num(c.dissemination_s),
            _num(c.generation_s),
            _num(c.tail_s),
            str(c.s_min),
            "" if c.reachable else "yes",
            style=style,
        )
    return table


def _segment_rows(plan: Plan) -> list[tuple[str, str]]:
    """With workload.segment_s: the swap granularity and the tokens it leaves too stale."""
    if plan.segment_s is None:
        return []
    return [("segment swaps (T_seg)", f"every {_num(plan.segment_s)} s of generation: "
             f"{plan.masked_share:.1%} of trained tokens masked as older than S")]


def _summary(plan: Plan) -> Table:
    table = Table(show_header=False, box=None, padding=(0, 2))
    table.add_column(justify="left")
    table.add_column(justify="left")
    d = plan.uninformative_share
    base_row = ("required throughput B/T_train", f"{_num(plan.base_rps)} rollouts/s") if not d else (
        "required throughput B/((1-d) T_train)",
        f"{_num(plan.base_rps)} rollouts/s ({d:.0%} of groups dropped as uninformative: "
        f"x{1 / (1 - d):.3g} the batch generated)")
    rows = [
        base_row,
        ("R_required (with per-version stall)", f"{_num(plan.required_rps)} rollouts/s"),
        ("S_min (chosen set, else fastest class)", str(plan.s_min)),
        *_segment_rows(plan),
        (
            "chosen workers",
            f"{plan.n_workers} ({_num(plan.rollouts_per_s)} rollouts/s, {_num(plan.admissible_rps)} admissible)",
        ),
        (
            "dissemination latency (slowest chosen)",
            f"{_num(plan.dissemination_s)} s" if plan.n_workers else "-",
        ),
        ("predicted learner utilization", f"{plan.utilization:.1%}"),
        (
            "$/h: learner + fleet = total",
            f"{_money(plan.learner_price_per_hour)} + {_money(plan.fleet_price_per_hour)} "
            f"= {_money(plan.total_price_per_hour)}",
        ),
        ("$/step  ($/accepted rollout)", f"{_money(plan.cost_per_step)}  ({_money(plan.cost_per_rollout)})"),
    ]
    if plan.baseline is not None:
        base = plan.baseline
        rows.append(
            (
                "centralized baseline: step, $/step ($/rollout)",
                f"{_num(base.step_wall_s)} s, {_money(base.cost_per_step)} ({_money(base.cost_per_rollout)})",
            )
        )
    if plan.saving_fraction is not None:
        rows.append(("saving vs centralized baseline", f"{plan.saving_fraction:.1%} per step"))
    gap = "optimal" if plan.gap == 0 else (f"gap <= {plan.gap:.1%}" if math.isfinite(plan.gap) else "n/a")
    rows.append(("activation solver", f"{plan.method} ({gap})"))
    for key, value in rows:
        table.add_row(key, value)
    return table


def render(plan: Plan, console: Console) -> None:
    # soft_wrap: sentences keep their lines whole (pasteable, greppable); the terminal wraps
    console.print(_header(plan), soft_wrap=True)
    for reason in plan.reasons:
        console.print(f"[red]why:[/] {reason}", soft_wrap=True)
    for fix in plan.fixes:
        console.print(f"[yellow]fix:[/] {fix}", soft_wrap=True)
    if not plan.feasible:
        console.print("[dim]numbers below: the fastest fleet the catalog allows[/]")
    console.print(_classes(plan))
    console.print(_summary(plan))
    for warning in plan.warnings:
        console.print(f"[yellow]warning:[/] {warning}", soft_wrap=True)
