"""What a run leaves when it ends (`echo2 run`, `echo2 report`): `summary.json` and the PNG
plots, both from metrics.jsonl; the summary lists the plots by their path in the run dir."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from echo2.report.metrics import iter_metrics
from echo2.report.summary import summarize


def finish_run(run_path: Path, plots: bool = True) -> dict[str, Any]:
    metrics = run_path / "metrics.jsonl"
    summary = summarize(iter_metrics(metrics))
    if plots:
        from echo2.report.plots import PLOTS_DIR, write_plots

        written = write_plots(iter_metrics(metrics), run_path / PLOTS_DIR)  # a second pass: the file is streamed
        summary["plots"] = [str(p.relative_to(run_path)) for p in written]
    (run_path / "summary.json").write_text(json.dumps(summary, indent=2))
    return summary
