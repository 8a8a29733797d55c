"""What a run leaves when it ends (`echo2 run`, `echo2 report`): `summary.json` and the PNG
plots, both from metrics.jsonl; the summary lists the plots by their path in the run dir."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from echo2.report.fleet_ledger import FleetLedger
from echo2.report.metrics import iter_metrics
from echo2.report.summary import summarize


def finish_run(run_path: Path, plots: bool = True) -> dict[str, Any]:
    metrics = run_path / "metrics.jsonl"
    summary = summarize(iter_metrics(metrics))
    summary["fleet"].update(fleet_bill(run_path, summary["steps"], _groups_trained(metrics)))
    if plots:
        from echo2.report.plots import PLOTS_DIR, write_plots

        written = write_plots(iter_metrics(metrics), run_path / PLOTS_DIR)  # a second pass: the file is streamed
        summary["plots"] = [str(p.relative_to(run_path)) for p in written]
    (run_path / "summary.json").write_text(json.dumps(summary, indent=2))
    return summary


def fleet_bill(run_path: Path, steps: int, groups: int) -> dict[str, Any]:
    """The machines a remote provider rented (its ledger): billed dollars in all, per learner step
    and per trained group, boot included, as clouds bill."""
    bill = FleetLedger(run_path).bill()
    if not bill:
        return {}
    return {**bill, "billed_usd_per_step": bill["billed_usd"] / steps if steps else None,
            "billed_usd_per_group": bill["billed_usd"] / groups if groups else None, "groups_trained": groups}


def _groups_trained(metrics: Path) -> int:
    """Groups in the batches the coordinator handed the learner."""
    return sum(sum(r["staleness_hist"].values()) for r in iter_metrics(metrics)
               if r.get("kind") == "batch_assigned" and r.get("role") == "coordinator")
