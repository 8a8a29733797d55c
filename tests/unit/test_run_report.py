"""What a run leaves at its end, from metrics.jsonl alone: the PNG plots (listed in summary.json
and in the printed summary), `echo2 report` redrawing them for a run dir, and the learner's
sample completions, bounded in count and length."""

from __future__ import annotations

import json

from tests.unit.learner_fakes import FakeIO, addition_batch, learner_config
from tests.unit.report_fixtures import report_run, write_report_run

from echo2.cli import main
from echo2.config.report import ReportConfig
from echo2.learner.samples import clip_text, sample_rows
from echo2.learner.train import Learner
from echo2.models.loading import load_tokenizer
from echo2.protocol.messages import RolloutCompletion, TrainGroup
from echo2.report.finish import finish_run
from echo2.report.plots import rolling_mean

PNG = b"\x89PNG\r\n\x1a\n"
ALL_PLOTS = ["plots/reward_accuracy.png", "plots/staleness.png", "plots/utilization.png", "plots/dissemination.png",
             "plots/cost.png"]


def test_plots_are_written_and_listed_in_the_summary(tmp_path):
    write_report_run(tmp_path, report_run(steps=12))
    summary = finish_run(tmp_path)
    assert summary["plots"] == ALL_PLOTS
    assert json.loads((tmp_path / "summary.json").read_text())["plots"] == ALL_PLOTS
    for name in ALL_PLOTS:
        data = (tmp_path / name).read_bytes()
        assert data.startswith(PNG) and len(data) > 10_000, name  # a drawn figure, not an empty canvas
    assert summary["steps"] == 12  # the summary itself is unchanged


def test_a_run_without_cost_records_or_workers_gets_the_plots_it_can_draw(tmp_path):
    records = [r for r in report_run(steps=5) if r["kind"] not in ("coordinator_stats", "weights_loaded")]
    write_report_run(tmp_path, records)
    assert finish_run(tmp_path)["plots"] == ALL_PLOTS[:3]
    assert not (tmp_path / "plots" / "cost.png").exists()
    assert "plots" not in finish_run(tmp_path, plots=False)


def test_echo2_report_redraws_plots_and_prints_them_in_the_summary(tmp_path, capsys):
    write_report_run(tmp_path, report_run(steps=6), tensorboard=False)
    assert main(["report", "--run-dir", str(tmp_path)]) == 0
    out = capsys.readouterr().out
    assert "plots (in the run dir)" in out and "plots/cost.png" in out
    assert json.loads((tmp_path / "summary.json").read_text())["plots"] == ALL_PLOTS
    assert not (tmp_path / "tensorboard").exists()  # sinks only with --follow


def test_echo2_report_follow_feeds_the_sinks_until_the_learner_is_done(tmp_path):
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    write_report_run(tmp_path, report_run(steps=6))
    # learner_done of the run's 6 steps is in the file: --follow replays it and returns
    assert main(["report", "--run-dir", str(tmp_path), "--follow", "--set", "report.plots=false"]) == 0
    events = EventAccumulator(str(tmp_path / "tensorboard"))
    events.Reload()
    assert [e.step for e in events.Scalars("train/reward_mean")] == [1, 2, 3, 4, 5, 6]
    assert not (tmp_path / "plots").exists()
    assert main(["report", "--run-dir", str(tmp_path), "--set", "train.steps=9"]) == 2  # only report.* fields


def test_rolling_mean():
    assert rolling_mean([1.0, 3.0, 5.0, 7.0], window=2) == [1.0, 2.0, 4.0, 6.0]


def test_sample_completions_are_bounded_in_count_and_length():
    cfg = ReportConfig(samples_per_step=3, sample_chars=20)
    long_prompt, long_completion = "question " * 100 + "what is 2+2?", "4" + " and more" * 100
    groups = [TrainGroup(lease_id=f"g{i}", prompt_index=i, prompt_ids=[i], version=7, worker_id=f"w{i}",
                         rewards=[1.0, 0.0],
                         completions=[RolloutCompletion(token_ids=[i, 1], logprobs=[-1.0, -1.0])] * 2)
              for i in range(10)]
    decode = {(i,): long_prompt for i in range(10)} | {(i, 1): long_completion for i in range(10)}
    rows = sample_rows(groups, lambda ids: decode[tuple(ids)], cfg)
    assert len(rows) == 3
    assert all(len(r["prompt"]) == 20 and len(r["completion"]) == 20 for r in rows)
    assert rows[0]["prompt"].endswith("what is 2+2?") and rows[0]["completion"].startswith("4 and")
    assert rows[2] == {**rows[2], "reward": 1.0, "worker_id": "w2", "version": 7}
    assert clip_text("short", 20, keep="start") == "short"


def test_the_learner_logs_sample_completions_every_n_steps(tmp_path, tiny_model_dir):
    tokenizer = load_tokenizer(str(tiny_model_dir))
    cfg = learner_config(tmp_path / "run", tiny_model_dir, train={"steps": 3},
                         report={"samples_every_steps": 2, "samples_per_step": 1, "sample_chars": 16})
    Learner(cfg, "", learner_token="",
            io=FakeIO([addition_batch(tokenizer, seed) for seed in range(3)])).train()
    records = [json.loads(line) for line in (cfg.run_path / "metrics.jsonl").read_text().splitlines()]
    samples = [r for r in records if r["kind"] == "samples"]
    assert [r["step"] for r in samples] == [0, 2] and all(r["role"] == "learner" for r in samples)
    row = samples[0]["samples"][0]
    assert len(samples[0]["samples"]) == 1 and len(row["prompt"]) <= 16 and len(row["completion"]) <= 16
    assert row["prompt"].endswith("=") and row["worker_id"] == "w" and row["reward"] == 0.0
