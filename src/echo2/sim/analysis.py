"""Everything `echo2 sim` reports for one scenario: the main run, the three sweeps, and the
files they are written to (summary.json and three PNGs)."""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

from echo2.config.sim import ScenarioConfig
from echo2.sim import plots, sweeps
from echo2.sim.result import SimResult
from echo2.sim.simulator import simulate

PLOT_FILES = {
    "dissemination": "dissemination_vs_workers.png",
    "utilization": "utilization_vs_staleness.png",
    "cost": "cost_vs_centralized.png",
}


@dataclass
class Analysis:
    scenario: ScenarioConfig
    result: SimResult
    dissemination: dict | None
    utilization: dict | None
    cost: dict

    def to_dict(self) -> dict:
        return {
            "scenario": self.scenario.name,
            "seed": self.scenario.sim.seed,
            "main_run": self.result.to_dict(),
            "dissemination_vs_workers": self.dissemination,
            "utilization_vs_staleness": self.utilization,
            "cost_vs_centralized": self.cost,
        }


def analyze(scenario: ScenarioConfig, with_sweeps: bool = True) -> Analysis:
    """Run the scenario, then (a) and (b) around it; (c) compares the run with the baseline."""
    result = simulate(scenario)
    dissemination = sweeps.dissemination_vs_workers(scenario) if with_sweeps else None
    utilization = sweeps.utilization_grid(scenario, result.fleet) if with_sweeps and result.fleet else None
    return Analysis(scenario, result, dissemination, utilization, sweeps.cost_comparison(result))


def write_outputs(analysis: Analysis, out_dir: Path) -> dict[str, str]:
    """summary.json and the PNGs that have data; returns name -> path."""
    out_dir.mkdir(parents=True, exist_ok=True)
    title = analysis.scenario.workload.model or analysis.scenario.name
    written = {"summary": out_dir / "summary.json"}
    written["summary"].write_text(json.dumps(analysis.to_dict(), indent=2, allow_nan=False))
    if analysis.dissemination is not None:
        written["dissemination"] = plots.plot_dissemination(
            analysis.dissemination, title, out_dir / PLOT_FILES["dissemination"]
        )
    if analysis.utilization is not None:
        written["utilization"] = plots.plot_utilization(
            analysis.utilization,
            title,
            analysis.scenario.workload.step_time_s,
            out_dir / PLOT_FILES["utilization"],
        )
    written["cost"] = plots.plot_cost(analysis.cost, title, out_dir / PLOT_FILES["cost"])
    return {name: str(path) for name, path in written.items()}
