"""Multi-turn tasks on the torch side: the format warm start labels only the actions, a short
one teaches the tiny model to play legal moves, the learner trains on episode groups and
evaluates by playing held-out episodes, and `echo2 eval` reports reward and win rate per
opponent."""

from __future__ import annotations

import json
import random

import pytest
import torch
from tests.unit.learner_fakes import FakeIO

from echo2.cli import main
from echo2.config.run import RunConfig, WarmStartConfig
from echo2.envs.play import play
from echo2.envs.transcript import Codec
from echo2.learner.train import Learner
from echo2.learner.warmstart import env_sft_batch, warm_start
from echo2.models.env_evaluation import evaluate_episodes, mean_ci
from echo2.models.loading import load_model, load_tokenizer
from echo2.protocol.messages import RolloutCompletion, TrainGroup
from echo2.report.metrics import read_metrics
from echo2.tasks import make_task


def poker_config(run_dir, model_dir, **task) -> RunConfig:
    return RunConfig.model_validate({
        "run_dir": str(run_dir), "model": {"source": str(model_dir)}, "warmstart": {"steps": 0},
        "task": {"name": "poker", "eval_size": 8, "instruction": "", **task},
        "sampling": {"max_new_tokens": 2, "group_size": 4}, "grpo": {"prompts_per_step": 2, "lr": 1e-2},
        "train": {"steps": 2, "checkpoint_every": 1, "eval_every": 1}, "audit": {"enabled": False},
    })


def test_the_format_warm_start_labels_only_the_actions(tiny_model_dir):
    tokenizer = load_tokenizer(str(tiny_model_dir))
    task = make_task(poker_config("r", tiny_model_dir, game="leduc").task, 0)
    ids, mask, labels = env_sft_batch(tokenizer, task, start=0, size=16, max_action_tokens=2)
    eos = tokenizer.eos_token_id
    for row, keep, label in zip(ids.tolist(), mask.tolist(), labels.tolist(), strict=True):
        trained = [(i, t) for i, t in enumerate(label) if t != -100]
        assert trained and len(trained) % 2 == 0  # a letter and the end of the turn, per action
        for (i, letter), (j, end) in zip(trained[0::2], trained[1::2], strict=True):
            assert j == i + 1 and end == eos and tokenizer.decode([letter]) in "fcb" and row[i] == letter
        assert sum(keep) > len(trained) * 5  # the observations are there, as context


def test_a_short_warm_start_teaches_legal_play(tiny_model_dir):
    model, tokenizer = load_model(str(tiny_model_dir)), load_tokenizer(str(tiny_model_dir))
    task = make_task(poker_config("r", tiny_model_dir).task, 0)

    def illegal() -> float:
        report = evaluate_episodes(model, tokenizer, task, 2, opponents=["random"], episodes=60)
        return report["opponents"]["random"]["illegal_rate"]

    assert illegal() > 0.9  # an untrained model writes anything
    torch.manual_seed(0)
    warm_start(model, tokenizer, task, WarmStartConfig(steps=40, batch_size=16, lr=1e-2), seed=0,
               max_action_tokens=2)
    assert illegal() < 0.1


def test_mean_ci():
    mean, half = mean_ci([1.0, -1.0] * 50)
    assert mean == 0.0 and half == pytest.approx(1.96 * (100 / 99) ** 0.5 / 10)
    assert mean_ci([0.5]) == (0.5, float("inf"))


def episode_groups(task, codec, start: int, groups: int = 2, size: int = 4) -> list[TrainGroup]:
    rng, out = random.Random(start), []
    for index in range(start, start + groups):
        episodes = [task.episode(codec, task.train_seed(index), 2) for _ in range(size)]
        play(episodes, lambda batch: [(codec.encode(rng.choice("cb")) + [codec.eos_id], [-0.7, -0.05])
                                      for _ in batch])
        out.append(TrainGroup(lease_id=f"g{index}", prompt_index=index, prompt_ids=episodes[0].prompt_ids, version=0,
                              worker_id="w", rewards=[e.reward for e in episodes],
                              completions=[RolloutCompletion(token_ids=e.token_ids, logprobs=e.logprobs,
                                                             segments=e.segments) for e in episodes]))
    return out


def test_the_learner_trains_on_episodes_and_evaluates_by_playing(tmp_path, tiny_model_dir):
    cfg = poker_config(tmp_path / "run", tiny_model_dir)
    task = make_task(cfg.task, cfg.seed)
    codec = Codec.from_tokenizer(load_tokenizer(str(tiny_model_dir)), cfg.task)
    Learner(cfg, "", learner_token="",
            io=FakeIO([episode_groups(task, codec, 0), episode_groups(task, codec, 2)])).train()
    records = read_metrics(cfg.run_path / "metrics.jsonl")
    steps = [r for r in records if r["kind"] == "train_step"]
    assert len(steps) == 2 and not any(s["skipped"] for s in steps)
    evals = [r for r in records if r["kind"] == "eval"]
    assert [e["step"] for e in evals] == [0, 1, 2]
    for e in evals:
        assert e["opponent"] == "random" and e["problems"] == 8 and -1.0 <= e["mean_reward"] <= 1.0
        assert 0.0 <= e["accuracy"] <= 1.0 and e["mean_reward_ci95"] >= 0


def test_echo2_eval_reports_reward_and_win_rate_per_opponent(tiny_model_dir, capsys):
    args = ["eval", "--checkpoint", str(tiny_model_dir), "--task", "poker", "--set", "task.game=leduc",
            "--set", "sampling.max_new_tokens=2", "--limit", "12"]
    assert main([*args, "--json"]) == 0
    result = json.loads(capsys.readouterr().out)
    assert result["episodes_per_opponent"] == 12 and result["temperature"] == 0.0
    assert sorted(result["opponents"]) == ["calling_station", "equity", "random"]
    for r in result["opponents"].values():
        assert r["episodes"] == 12 and -1.0 <= r["mean_reward"] <= 1.0 and 0 <= r["win_rate"] <= 1
    assert main([*args, "--n", "2", "--temperature", "1.0"]) == 0
    out = capsys.readouterr()
    assert "mean reward (95% CI)" in out.err and json.loads(out.out)["episodes_per_opponent"] == 24
