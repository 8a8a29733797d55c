"""`--set` next to `--run-dir` is never silently ignored: it changes the run's config.json (the
documented `echo2 coordinator --run-dir DIR --set coordinator.host=0.0.0.0` used to bind
127.0.0.1), fields a run in progress cannot change are refused naming the flag, and a flag
that cannot apply (`--config` with `--run-dir`) is refused too."""

from __future__ import annotations

import json

import pytest

from echo2.cli import main
from echo2.config.run import RunConfig
from echo2.config.run_dir import read_resolved, resolved_with_overrides, write_resolved


@pytest.fixture
def run_dir(tmp_path):
    cfg = RunConfig(run_dir=str(tmp_path / "run"))
    write_resolved(cfg)
    return cfg.run_path


def test_set_applies_on_top_of_the_run_dir_and_is_written_back(run_dir):
    cfg = resolved_with_overrides(str(run_dir), ["coordinator.host=0.0.0.0", "coordinator.port=18777",
                                                 "learner.advertise_host=10.0.0.5", "train.steps=500"])
    assert (cfg.coordinator.host, cfg.coordinator.port, cfg.learner.advertise_host) == ("0.0.0.0", 18777, "10.0.0.5")
    assert cfg.train.steps == 500
    again = read_resolved(str(run_dir))  # what a restarted role, `echo2 export` or the other roles read
    assert again == cfg
    assert not list(run_dir.glob(".config.json.*[0-9]"))  # no temporary file left behind


def test_secrets_given_with_set_are_not_written(run_dir):
    cfg = resolved_with_overrides(str(run_dir), ["coordinator.auth_token=secret-0123456789abcdef"])
    assert cfg.coordinator.auth_token == "secret-0123456789abcdef"
    assert "secret-0123456789abcdef" not in (run_dir / "config.json").read_text()


@pytest.mark.parametrize("item", ["model.hidden_size=64", "train.max_staleness=5", "sampling.group_size=4",
                                  "task.digits=3", "grpo.prompts_per_step=2", "run_dir=elsewhere",
                                  "broadcast.chunk_bytes=65536", "seed=3"])
def test_changes_that_would_break_the_run_are_refused(run_dir, item):
    before = (run_dir / "config.json").read_text()
    with pytest.raises(ValueError, match=rf"--set {item}: .* is fixed for the run in .*Start a new run dir"):
        resolved_with_overrides(str(run_dir), [item])
    assert (run_dir / "config.json").read_text() == before


def test_a_bad_value_names_the_field_and_changes_nothing(run_dir):
    before = (run_dir / "config.json").read_text()
    with pytest.raises(ValueError, match="coordinator.port"):
        resolved_with_overrides(str(run_dir), ["coordinator.port=99999"])
    assert (run_dir / "config.json").read_text() == before


def test_the_commands_refuse_what_they_cannot_apply(run_dir, tmp_path, capsys):
    toml = tmp_path / "other.toml"
    toml.write_text("[train]\nsteps = 3\n")
    assert main(["coordinator", "--run-dir", str(run_dir), "--config", str(toml)]) == 2
    assert "--config" in capsys.readouterr().err
    assert main(["learner", "--run-dir", str(run_dir), "--set", "model.source=other"]) == 2
    assert "--set model.source=other: model is fixed" in capsys.readouterr().err
    assert json.loads((run_dir / "config.json").read_text())["model"]["source"] == "tiny"
    with pytest.raises(SystemExit):  # export takes no --set: argparse says so, nothing is ignored
        main(["export", "--run-dir", str(run_dir), "--out", str(tmp_path / "x"), "--set", "train.steps=1"])
    assert "unrecognized arguments: --set" in capsys.readouterr().err
