"""Render the run summary as rich tables for the terminal."""

from __future__ import annotations

from typing import Any

from rich.console import Console
from rich.table import Table


def _fmt(value: Any) -> str:
    if value is None:
        return "-"
    if isinstance(value, float):
        return f"{value:.3f}"
    return str(value)


def render_summary(summary: dict[str, Any], console: Console) -> None:
    table = Table(title="echo2 run summary", show_header=False)
    table.add_column("metric")
    table.add_column("value")
    before, after = summary["accuracy_before"], summary["accuracy_after"]
    table.add_row("learner steps", _fmt(summary["steps"]))
    table.add_row("held-out accuracy before -> after", f"{_fmt(before)} -> {_fmt(after)}")
    table.add_row("learner utilization (steady)", f"{summary['learner_utilization']:.1%} ({summary['learner_utilization_steady']:.1%})")
    table.add_row("staleness of trained groups", _fmt(summary["staleness_hist"]))
    table.add_row("rollouts dropped (stale)", _fmt(summary["rollouts_dropped_stale"]))
    table.add_row("leases requeued / workers lost", f"{summary['leases_requeued']} / {summary['workers_lost']}")
    console.print(table)
    workers = Table(title="workers")
    for column in ("worker", "tokens/s", "publish->loaded p50 s", "p95 s", "max s", "versions loaded"):
        workers.add_column(column)
    latency = summary["publish_to_loaded_s"]
    for worker in sorted(set(summary["tokens_per_s"]) | set(latency)):
        lat = latency.get(worker, {"p50": 0.0, "p95": 0.0, "max": 0.0, "n": 0})
        workers.add_row(worker, _fmt(summary["tokens_per_s"].get(worker)), f"{lat['p50']:.3f}",
                        f"{lat['p95']:.3f}", f"{lat['max']:.3f}", str(lat["n"]))
    console.print(workers)
