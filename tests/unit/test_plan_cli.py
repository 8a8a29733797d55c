"""`echo2 plan` end to end, in process: the example catalog parses, the table and JSON carry
the key numbers, infeasible requests explain themselves, bad input is one readable error."""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

import echo2
from echo2.cli import main
from echo2.config.catalog import PlanConfig, load_plan_config

ROOT = Path(__file__).resolve().parents[2]
EXAMPLE = str(ROOT / "configs" / "catalog" / "example.toml")


def test_example_catalog_parses():
    cfg = load_plan_config(EXAMPLE)
    assert isinstance(cfg, PlanConfig)
    assert cfg.workload.batch_rollouts == 512
    assert cfg.workload.snapshot_bytes == pytest.approx(16.38e9)
    assert {"rtx4090_dc", "rtx4090_home", "a100_spot", "h100_spot"} <= set(cfg.workers)
    assert cfg.worker_rps(cfg.workers["a100_spot"]) == pytest.approx(3500 / 3000)


def test_plan_table_on_the_example(capsys):
    assert main(["plan", "--catalog", EXAMPLE]) == 0
    out = capsys.readouterr().out
    for needle in (
        "feasible",
        "required throughput B/T_train",
        "R_required",
        "S_min",
        "chosen workers",
        "predicted learner utilization",
        "100.0%",
        "$/h: learner + fleet",
        "$/step",
        "saving vs centralized baseline",
        "rtx4090_dc",
        "milp (optimal)",
    ):
        assert needle in out, needle


def test_plan_json_on_the_example(capsys):
    assert main(["plan", "--catalog", EXAMPLE, "--json"]) == 0
    plan = json.loads(capsys.readouterr().out)
    assert plan["feasible"] is True
    assert plan["base_rps"] == pytest.approx(6.4)
    assert plan["required_rps"] >= plan["base_rps"]
    assert plan["admissible_rps"] >= plan["base_rps"] * (1 - 1e-6)
    assert plan["utilization"] == 1.0
    assert plan["s_min"] <= plan["max_staleness"]
    assert sum(plan["chosen"].values()) == plan["n_workers"] > 0
    fleet = sum(c["price_per_hour"] * c["chosen"] for c in plan["classes"])
    assert plan["fleet_price_per_hour"] == pytest.approx(fleet)
    assert plan["cost_per_step"] == pytest.approx(plan["total_price_per_hour"] * 80 / 3600)
    assert 0 < plan["saving_fraction"] < 1
    assert plan["cost_per_step"] < plan["baseline"]["cost_per_step"]


def test_infeasible_request_explains_itself(capsys):
    assert main(["plan", "--catalog", EXAMPLE, "--set", "workload.max_staleness=1"]) == 1
    out = capsys.readouterr().out
    assert "INFEASIBLE" in out
    assert "S=1 cannot hide" in out and "with a 80 s learner step: S_min=4" in out
    assert "set workload.max_staleness=4" in out


def test_infeasible_json_carries_reasons_and_fixes(capsys):
    assert main(["plan", "--catalog", EXAMPLE, "--json", "--set", "workload.max_staleness=2"]) == 1
    plan = json.loads(capsys.readouterr().out)
    assert plan["feasible"] is False and plan["gap"] is None
    assert "S_min=4" in plan["reasons"][0]
    assert plan["fixes"][0].startswith("set workload.max_staleness=4")


def test_overrides_and_workload_file(tmp_path, capsys):
    workload = tmp_path / "w.toml"
    workload.write_text(
        "[workload]\nparams = 4e9\nprompts_per_step = 16\ngroup_size = 8\ntokens_per_rollout = 1000\n"
        'step_time_s = 30\nmax_staleness = 3\ngeneration_time_s = 40\n[broadcast]\ntopology = "tree"\n'
    )
    args = [
        "plan",
        "--catalog",
        EXAMPLE,
        "--workload",
        str(workload),
        "--json",
        "--set",
        "workers.a100_spot.count=0",
    ]
    assert main(args) == 0
    plan = json.loads(capsys.readouterr().out)
    assert plan["batch_rollouts"] == 128 and plan["topology"] == "tree"
    assert "a100_spot" not in plan["chosen"]


def test_bad_input_is_one_readable_error(tmp_path, capsys):
    assert main(["plan", "--catalog", EXAMPLE, "--set", "workload.step_time=3"]) == 2
    err = capsys.readouterr().err
    assert "workload.step_time: unknown field; did you mean 'step_time_s'?" in err
    assert main(["plan", "--catalog", str(tmp_path / "missing.toml")]) == 2
    assert "does not exist" in capsys.readouterr().err
    bad = tmp_path / "bad.toml"
    bad.write_text(
        Path(EXAMPLE).read_text().replace("tokens_per_s = 6000", "tokens_per_s = 6000\nrollouts_per_s = 2")
    )
    assert main(["plan", "--catalog", str(bad)]) == 2
    assert (
        "workers.h100_spot: Value error, give exactly one of rollouts_per_s or tokens_per_s"
        in capsys.readouterr().err
    )


def test_planner_and_cli_import_without_torch():
    # a fresh interpreter: other tests' imports must not hide a torch import here
    code = (
        "import sys, echo2.planner, echo2.cli, echo2.cli.plan_cmd, echo2.cli.plan_render, echo2.planner.diagnose;"
        "from echo2.cli import main;"
        f"rc = main(['plan', '--catalog', {EXAMPLE!r}, '--json']);"
        "assert rc == 0, rc;"
        "assert 'torch' not in sys.modules, 'torch was imported'"
    )
    src = str(Path(echo2.__file__).resolve().parents[1])
    env = {**os.environ, "PYTHONPATH": src}
    result = subprocess.run(
        [sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=120
    )
    assert result.returncode == 0, result.stderr
