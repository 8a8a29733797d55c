"""The learner's in-run evaluation of a multi-turn task, every train.eval_every steps: greedy
episodes of echo2's own environments against the training opponent (`accuracy` is then the win
rate), or of a verifiers environment's held-out tasks (`accuracy`: the share rewarded 1)."""

from __future__ import annotations

import logging
from collections.abc import Callable
from contextlib import AbstractContextManager

from echo2.config.run import RunConfig
from echo2.models.env_evaluation import evaluate_episodes
from echo2.report.metrics import MetricsWriter

log = logging.getLogger("echo2.learner")


def evaluate_episodes_in_run(model, tokenizer, task, cfg: RunConfig, *, step: int,
                             autocast: Callable[[], AbstractContextManager], metrics: MetricsWriter) -> None:
    if task.kind == "agent":
        _agent(model, tokenizer, task, cfg, step=step, autocast=autocast, metrics=metrics)
        return
    opponent = task.training_opponent()
    with autocast():
        report = evaluate_episodes(model, tokenizer, task, cfg.sampling.max_new_tokens, opponents=[opponent])
    result = report["opponents"][opponent]
    metrics.write("eval", step=step, accuracy=result["win_rate"], mean_reward=result["mean_reward"],
                  mean_reward_ci95=result["ci95"], illegal_rate=result["illegal_rate"],
                  problems=result["episodes"], opponent=opponent, eval_s=report["seconds"])
    log.info("eval after step %d: mean reward %.3f +- %.3f, win rate %.3f, illegal %.3f over %d episodes "
             "against %s", step, result["mean_reward"], result["ci95"], result["win_rate"], result["illegal_rate"],
             result["episodes"], opponent)


def _agent(model, tokenizer, task, cfg: RunConfig, *, step: int, autocast: Callable[[], AbstractContextManager],
           metrics: MetricsWriter) -> None:
    from echo2.models.agent_evaluation import evaluate_agent

    with autocast():
        report = evaluate_agent(model, tokenizer, task, cfg.sampling.max_new_tokens,
                                tokenizer_source=cfg.base_model_path)
    metrics.write("eval", step=step, accuracy=report["accuracy"], mean_reward=report["mean_reward"],
                  mean_reward_ci95=report["ci95"], problems=report["episodes"], tool_call_rate=report["tool_call_rate"],
                  tokens_per_episode=report["tokens_per_episode"], eval_s=report["seconds"],
                  episodes_failed=report["failed"])
    log.info("eval after step %d: accuracy %.3f, mean reward %.3f +- %.3f over %d held-out episodes", step,
             report["accuracy"], report["mean_reward"], report["ci95"], report["episodes"])
    if report["failed"]:  # scored 0 by the environment: an error or a deadline, not an answer
        log.warning("eval after step %d: %d of %d held-out episodes failed (an environment error or a deadline of "
                    "task.episode_timeout_s) and count as wrong", step, report["failed"], report["episodes"])
