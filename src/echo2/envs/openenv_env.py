"""OpenEnv environments (`openenv-core`, the environment API TRL trains on) as echo2 multi-turn
tasks: `OpenEnvAdapter` is an echo2 `Environment` over an OpenEnv one, so the worker plays it,
the coordinator replays it and the warm start and the evaluation run it exactly as they do poker.

- The model's reply (decoded text, stripped) fills one field of the environment's Action
  (`task.action_field`); an Action the environment's own schema refuses ends the episode with
  `task.illegal_reward`.
- The Observation becomes the next user turn: `task.observation_field`, or its only text field,
  or else every field but done, reward and metadata as JSON (sorted keys, so replays agree).
- Each step's `reward` (None counts 0) adds to the episode's; `done` ends it.
- In-process (`task.environment`): the class is built with `task.args`. Over a server
  (`task.url`, on localhost): OpenEnv's own client (`GenericEnvClient`, a WebSocket session per
  episode, timeouts on connecting and on every answer).
"""

from __future__ import annotations

import importlib
import json
import random
import typing
from typing import Any

from echo2.config.task import OpenEnvConfig
from echo2.envs.base import Environment, StepResult
from echo2.envs.task import EnvTask

MISSING = ("task.name = \"openenv\" needs OpenEnv: pip install 'echo2[openenv]' (openenv-core) on the coordinator "
           "and every worker")
HIDDEN_FIELDS = ("done", "reward", "metadata")


def load_attr(path: str, what: str) -> Any:
    """`package.module:Name`, or a clear error naming the field that gave it."""
    module_name, _, attr = path.partition(":")
    try:
        module = importlib.import_module(module_name)
    except ImportError as exc:
        raise ValueError(f"task.{what} = {path!r}: cannot import {module_name!r} ({exc}); install it where the run "
                         "plays (the coordinator and every worker)") from None
    if not hasattr(module, attr):
        raise ValueError(f"task.{what} = {path!r}: {module_name!r} has no {attr!r}")
    return getattr(module, attr)


def declared_action(env_cls: type) -> type | None:
    """The Action class of `class E(Environment[Action, Observation, State])`, if declared."""
    for klass in env_cls.__mro__:
        for base in getattr(klass, "__orig_bases__", ()):
            args = typing.get_args(base)
            if args and isinstance(args[0], type):
                return args[0]
    return None


def observation_text(fields: dict[str, Any], field: str) -> str:
    """What the model is told of an observation (its fields as a dict)."""
    if field:
        if field not in fields:
            raise ValueError(f"task.observation_field = {field!r}: the observation has fields {sorted(fields)}")
        return str(fields[field])
    shown = {k: v for k, v in fields.items() if k not in HIDDEN_FIELDS}
    texts = [v for v in shown.values() if isinstance(v, str)]
    if len(shown) == 1 and len(texts) == 1:
        return texts[0]
    return json.dumps(shown, sort_keys=True, default=str)


class InProcess:
    """An OpenEnv Environment built here; steps return (observation fields, reward, done)."""

    def __init__(self, cfg: OpenEnvConfig) -> None:
        try:
            from openenv.core.env_server import Environment as OpenEnvironment
        except ImportError:
            raise ValueError(MISSING) from None
        env_cls = load_attr(cfg.environment, "environment")
        if not (isinstance(env_cls, type) and issubclass(env_cls, OpenEnvironment)):
            raise ValueError(f"task.environment = {cfg.environment!r} is not an openenv.core Environment subclass")
        action_cls = load_attr(cfg.action, "action") if cfg.action else declared_action(env_cls)
        if action_cls is None:
            raise ValueError(f"task.environment = {cfg.environment!r} declares no Action type "
                             "(Environment[Action, Observation, State]): give task.action = \"package.module:Action\"")
        if cfg.action_field not in getattr(action_cls, "model_fields", {}):
            raise ValueError(f"task.action_field = {cfg.action_field!r}: {action_cls.__name__} has fields "
                             f"{sorted(getattr(action_cls, 'model_fields', {}))}")
        try:
            self.env = env_cls(**cfg.args)
        except TypeError as exc:
            raise ValueError(f"task.args {sorted(cfg.args)}: {cfg.environment} refused them ({exc})") from None
        self.action_cls, self.action_field = action_cls, cfg.action_field

    def reset(self, seed: int) -> tuple[dict, float, bool]:
        return self._fields(self.env.reset(seed=seed))

    def step(self, text: str) -> tuple[dict, float, bool] | None:
        """None: the Action class refused the reply."""
        from pydantic import ValidationError

        try:
            action = self.action_cls(**{self.action_field: text})
        except ValidationError:
            return None
        return self._fields(self.env.step(action))

    @staticmethod
    def _fields(observation) -> tuple[dict, float, bool]:
        return observation.model_dump(), float(observation.reward or 0.0), bool(observation.done)

    def close(self) -> None:
        self.env.close()


class OverServer:
    """An OpenEnv server reached with OpenEnv's GenericEnvClient: one session per episode."""

    def __init__(self, cfg: OpenEnvConfig) -> None:
        try:
            from openenv.core import GenericEnvClient
        except ImportError:
            raise ValueError(MISSING) from None
        self.client_cls, self.cfg, self.session = GenericEnvClient, cfg, None

    def reset(self, seed: int) -> tuple[dict, float, bool]:
        self.close()
        client = self.client_cls(base_url=self.cfg.url.rstrip("/"), connect_timeout_s=self.cfg.timeout_s,
                                 message_timeout_s=self.cfg.timeout_s)
        self.session = client.sync()
        self.session.connect()
        return self._fields(self.session.reset(seed=seed))

    def step(self, text: str) -> tuple[dict, float, bool] | None:
        assert self.session is not None, "reset first"
        try:
            result = self.session.step({self.cfg.action_field: text})
        except RuntimeError as exc:  # the server refused the action (its schema's validation error)
            if "validation" in str(exc).lower():
                return None
            raise
        return self._fields(result)

    @staticmethod
    def _fields(result) -> tuple[dict, float, bool]:
        fields = dict(result.observation)
        return fields, float(result.reward or 0.0), bool(result.done)

    def close(self) -> None:
        if self.session is not None:
            session, self.session = self.session, None
            session.close()


class OpenEnvAdapter(Environment):
    def __init__(self, cfg: OpenEnvConfig) -> None:
        self.cfg = cfg
        self.source = OverServer(cfg) if cfg.url else InProcess(cfg)

    def reset(self, seed: int) -> str:
        fields, _, _ = self.source.reset(seed)
        return observation_text(fields, self.cfg.observation_field)

    def step(self, action: str) -> StepResult:
        stepped = self.source.step(action)
        if stepped is None:
            self.source.close()
            return StepResult(observation=f"{action[:40]!r} is not an action this environment takes.",
                              reward=self.cfg.illegal_reward, done=True, illegal=True)
        fields, reward, done = stepped
        if done:
            self.source.close()  # a server session ends with its episode
        return StepResult(observation=observation_text(fields, self.cfg.observation_field), reward=reward,
                          done=done, won=done and reward > 0)

    def demo_action(self, rng: random.Random) -> str:
        if not self.cfg.demo_actions:
            raise ValueError("the warm start imitates task.demo_actions, and there are none: list replies in the "
                             "environment's format, or set warmstart.steps = 0 (a pretrained model)")
        return rng.choice(self.cfg.demo_actions)


class OpenEnvTask(EnvTask):
    name = "openenv"

    def __init__(self, cfg: OpenEnvConfig, seed: int) -> None:
        super().__init__(cfg, seed)
        self.openenv_cfg = cfg

    def make_env(self, opponent_name: str | None = None) -> Environment:
        return OpenEnvAdapter(self.openenv_cfg)

    def check(self) -> None:
        """Builds it and plays a reset twice: its first observation must come from the seed alone,
        or no replay at the coordinator could ever agree with a worker."""
        env = self.make_env()
        seed = self.train_seed(0)
        first, again = env.reset(seed), env.reset(seed)
        if first != again:
            raise ValueError(f"task: {self.openenv_cfg.environment or self.openenv_cfg.url} gave two different first "
                             f"observations for seed {seed} ({first[:60]!r}, {again[:60]!r}): reset(seed) must draw "
                             "everything from the seed, as the coordinator replays every episode")
