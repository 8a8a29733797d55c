"""`echo2 sim` end to end, in process: table, JSON and plots; bad input is one readable error."""

import json
from pathlib import Path

from echo2.cli import main

ROOT = Path(__file__).resolve().parents[2]
QWEN3_8B = str(ROOT / "configs" / "sim" / "qwen3_8b.toml")
SMALL = [
    "--set",
    "sim.steps=10",
    "--set",
    "sweep.steps=4",
    "--set",
    "sweep.staleness=[1, 4]",
    "--set",
    "sweep.bandwidths_bps=[1e9]",
    "--set",
    "sweep.worker_counts=[1, 8]",
]


def test_table_and_files(tmp_path, capsys):
    assert main(["sim", "--scenario", QWEN3_8B, "--out", str(tmp_path), *SMALL]) == 0
    out = capsys.readouterr().out
    for needle in (
        "Qwen3-8B",
        "learner utilization",
        "total cost",
        "saving vs centralized",
        "33-36%",
        "dissemination_vs_workers.png",
    ):
        assert needle in out, needle
    for name in (
        "summary.json",
        "dissemination_vs_workers.png",
        "utilization_vs_staleness.png",
        "cost_vs_centralized.png",
    ):
        assert (tmp_path / name).stat().st_size > 1000, name


def test_json_output(tmp_path, capsys):
    assert main(["sim", "--scenario", QWEN3_8B, "--out", str(tmp_path), "--json", *SMALL]) == 0
    data = json.loads(capsys.readouterr().out)
    assert data["main_run"]["steps_done"] == 10
    assert set(data["dissemination_vs_workers"]["topologies"]) == {"one_to_many", "chain", "tree", "ideal"}
    assert data["utilization_vs_staleness"]["staleness"] == [1, 4]
    assert data["cost_vs_centralized"]["centralized"]["total_cost"] > 0
    assert json.loads((tmp_path / "summary.json").read_text())["seed"] == 0


def test_no_sweeps_writes_only_the_cost_plot(tmp_path, capsys):
    assert (
        main(["sim", "--scenario", QWEN3_8B, "--out", str(tmp_path), "--no-sweeps", "--set", "sim.steps=5"])
        == 0
    )
    assert not (tmp_path / "dissemination_vs_workers.png").exists()
    assert (tmp_path / "cost_vs_centralized.png").exists()


def test_bad_override_names_the_field(tmp_path, capsys):
    code = main(["sim", "--scenario", QWEN3_8B, "--out", str(tmp_path), "--set", "sim.stepz=5"])
    err = capsys.readouterr().err
    assert code == 2
    assert "sim.stepz" in err and "did you mean 'steps'" in err
    assert main(["sim", "--scenario", QWEN3_8B, "--set", "broadcast.topology=mesh"]) == 2
    assert "broadcast.topology" in capsys.readouterr().err
