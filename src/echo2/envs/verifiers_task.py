"""The adapter of `[task] name = "verifiers"` (a task of kind "agent"): which of the taskset's
tasks are held out and which are trained on in what order, and the `VerifiersEpisodes` each
process plays or replays them with. Torch-free: the coordinator and its scoring processes use
it, as the workers and the learner do."""

from __future__ import annotations

import random
from functools import cached_property
from typing import Literal

from echo2.config.task import VerifiersConfig
from echo2.envs.verifiers_env import (
    EnvironmentLoadError,
    VerifiersEpisodes,
    VerifiersSpec,
    load_taskset,
    renderer_config,
)
from echo2.envs.verifiers_judges import missing_endpoint


class VerifiersTask:
    kind: Literal["agent"] = "agent"
    name = "verifiers"

    def __init__(self, cfg: VerifiersConfig, seed: int) -> None:
        self.cfg, self.seed = cfg, seed

    @property
    def instruction(self) -> str:
        return ""  # the environment writes its own prompts

    @cached_property
    def loaded(self) -> tuple:
        """The taskset and its tasks (imported and built once per process)."""
        return load_taskset(self.cfg.environment, self.cfg.args)

    def check(self) -> None:
        """Import the environment, build its tasks and check the renderer: each problem is one
        line naming the field, before any process starts."""
        renderer_config(self.cfg.renderer, self.cfg.tool_parser)
        missing = missing_endpoint(self.loaded[1], self.cfg.environment, self.cfg.judge)
        if missing is not None:
            raise EnvironmentLoadError(missing)
        count = len(self.loaded[1])
        if count <= self.cfg.eval_size:
            raise EnvironmentLoadError(f"task.environment = {self.cfg.environment!r} has {count} tasks and "
                                       f"task.eval_size = {self.cfg.eval_size} are held out: none is left to train "
                                       "on; lower task.eval_size or give the taskset more tasks")

    @cached_property
    def train_order(self) -> list[int]:
        """Task indices trained on, in the order prompts are drawn (shuffled by the run seed)."""
        indices = list(range(self.cfg.eval_size, len(self.loaded[1])))
        random.Random(f"echo2-verifiers:{self.seed}").shuffle(indices)
        return indices

    def train_index(self, prompt_index: int) -> int:
        """The task the prompt_index-th training prompt is (the stream wraps around)."""
        return self.train_order[prompt_index % len(self.train_order)]

    def eval_indices(self, count: int | None = None) -> list[int]:
        return list(range(min(count or self.cfg.eval_size, self.cfg.eval_size, len(self.loaded[1]))))

    def spec(self, max_new_tokens: int, *, run_judges: bool = True) -> VerifiersSpec:
        cfg = self.cfg
        return VerifiersSpec(cfg.environment, cfg.args, max_turns=cfg.max_turns, max_new_tokens=max_new_tokens,
                             max_episode_tokens=cfg.max_episode_tokens, renderer=cfg.renderer,
                             tool_parser=cfg.tool_parser, tool_timeout_s=cfg.tool_timeout_s,
                             max_tool_output_chars=cfg.max_tool_output_chars, episode_timeout_s=cfg.episode_timeout_s,
                             judge=cfg.judge, run_judges=run_judges, trust=cfg.trust)

    def episodes(self, tokenizer_source: str, max_new_tokens: int, *, run_judges: bool = True) -> VerifiersEpisodes:
        """Episodes with the model's tokenizer (its directory or hub id); enter it before playing.
        `run_judges` False: the tasks' LLM judges are taken out (a worker: its rewards are not used)."""
        return VerifiersEpisodes(self.spec(max_new_tokens, run_judges=run_judges), tokenizer_source,
                                 loaded=self.loaded)
