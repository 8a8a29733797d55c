"""OpenEnv environments as echo2 multi-turn tasks (echo2.envs.openenv_env), against the real
openenv-core: the shipped guess-the-number environment in-process and behind OpenEnv's own
server, episodes through the chat template, the coordinator's replay refusing a doctored
environment turn, and one clear error for each bad config."""

from __future__ import annotations

import os
import random
import subprocess
import sys
import time
from pathlib import Path

import pytest
from tests.sshd import free_port

from echo2.config.task import OpenEnvConfig
from echo2.envs.episode import ReplayMismatch, replay
from echo2.envs.openenv_env import OpenEnvTask
from echo2.envs.play import play
from echo2.envs.transcript import Codec
from echo2.tasks import make_task

pytest.importorskip("openenv.core.env_server")
from openenv.core.env_server import Action, Environment, Observation, State  # noqa: E402

GUESS = "echo2.envs.openenv_examples.guess:GuessEnvironment"
ROOT = Path(__file__).resolve().parents[2]


def task(**fields) -> OpenEnvTask:
    cfg = OpenEnvConfig(**{"environment": GUESS, "trust": "replayable", "max_turns": 6, "max_episode_tokens": 120,
                           **fields})
    return make_task(cfg, seed=0)


def guesser(codec, rng, replies=("8", "4", "12", "x", "2")):
    """Replies drawn from `replies` (a non-number among them: the Action's schema refuses it)."""
    def generate(batch):
        return [(codec.encode(rng.choice(replies)) + [codec.eos_id], [-0.5] * 2) for _ in batch]
    return generate


def test_the_guess_environment_plays_as_openenv_says(tiny_model_dir):
    env = task().make_env()
    assert env.reset(5) == "Guess my number from 1 to 16. 6 guesses left."  # its only text field, shown as is
    hint = env.step("8")
    assert not hint.done and hint.reward == 0.0 and hint.observation.endswith("than 8. 5 left.")
    refused = env.step("eight")  # GuessAction's pattern refuses it: the episode ends with the penalty
    assert refused.done and refused.illegal and refused.reward == -1.0
    secret = next(n for n in range(1, 17) if (env.reset(5), env.step(str(n)))[1].reward == 1.0)
    env.reset(5)
    won = env.step(str(secret))
    assert won.done and won.won and won.observation == f"{secret} is right."


def test_episodes_replay_at_the_coordinator_and_a_doctored_turn_is_refused(tiny_model_dir):
    guess = task()
    codec = Codec.from_source(str(tiny_model_dir), guess.cfg)
    episodes = [guess.episode(codec, guess.train_seed(i), 4) for i in range(16)]
    play(episodes, guesser(codec, random.Random(0)))
    assert "done" in {e.ended for e in episodes} and any(len(e.segments) >= 3 for e in episodes)
    assert any(e.illegal for e in episodes) and any(e.won for e in episodes)
    for e in episodes:  # the coordinator's replay: a fresh environment, the worker's actions
        again = replay(guess.episode(codec, e.seed, 4), e.token_ids, e.segments)
        assert again.reward == e.reward and again.token_ids == e.token_ids
    multi = next(e for e in episodes if len(e.segments) >= 3)
    start = multi.segments[0]
    answer = codec.tokenizer.decode(multi.token_ids[start:start + multi.segments[1]], skip_special_tokens=False)
    lie = answer.replace("Lower", "Higher") if "Lower" in answer else answer.replace("Higher", "Lower")
    doctored = codec.encode(lie)
    ids = multi.token_ids[:start] + doctored + multi.token_ids[start + multi.segments[1]:]
    segments = [multi.segments[0], len(doctored), *multi.segments[2:]]
    with pytest.raises(ReplayMismatch, match="segment 1"):
        replay(guess.episode(codec, multi.seed, 4), ids, segments)


class CoinObservation(Observation):
    text: str = ""
    flips: int = 0


class CoinAction(Action):
    message: str


class CoinEnvironment(Environment[CoinAction, CoinObservation, State]):
    """Draws from the global random state, not the seed: no replay could agree with a worker."""

    def reset(self, seed=None, episode_id=None, **kwargs) -> CoinObservation:
        return CoinObservation(text=random.choice(["heads", "tails"]) + str(random.random()), flips=0)

    def step(self, action, timeout_s=None, **kwargs) -> CoinObservation:
        return CoinObservation(text="again", flips=1, done=True, reward=1.0)

    @property
    def state(self) -> State:
        return State()


def test_bad_configs_are_one_clear_error_each():
    with pytest.raises(ValueError, match="reset\\(seed\\) must draw everything from the seed"):
        task(environment=f"{__name__}:CoinEnvironment").check()
    coin = task(environment=f"{__name__}:CoinEnvironment").make_env()
    assert coin.step("x").observation == '{"flips": 1, "text": "again"}'  # two fields: shown as JSON
    with pytest.raises(ValueError, match="has fields \\['message', 'metadata'\\]"):
        task(action_field="guess").make_env()
    with pytest.raises(ValueError, match="is not an openenv.core Environment subclass"):
        task(environment="echo2.envs.guess:GuessNumberEnv").make_env()
    with pytest.raises(ValueError, match="cannot import 'no_such_package.env'"):
        task(environment="no_such_package.env:Env").make_env()
    with pytest.raises(ValueError, match="has no 'Nope'"):
        task(environment="echo2.envs.openenv_examples.guess:Nope").make_env()
    with pytest.raises(ValueError, match="task.args \\['colour'\\]"):
        task(args={"colour": "red"}).make_env()
    with pytest.raises(ValueError, match="observation has fields"):
        task(observation_field="board").make_env().reset(1)
    with pytest.raises(ValueError, match="can only be \"replayable\""):
        OpenEnvConfig(environment=GUESS, trust="worker-trusted")
    with pytest.raises(ValueError, match="exactly one of environment"):
        OpenEnvConfig(environment=GUESS, url="http://127.0.0.1:8000", trust="replayable")
    with pytest.raises(ValueError, match="should match pattern"):  # a shared remote server: one more party to trust
        OpenEnvConfig(url="http://example.com:8000", trust="replayable")
    with pytest.raises(ValueError, match="warm start imitates task.demo_actions"):
        task().make_env().demo_action(random.Random(0))


def test_openenv_missing_is_named_with_its_install(monkeypatch):
    monkeypatch.setitem(sys.modules, "openenv.core.env_server", None)
    with pytest.raises(ValueError, match="pip install 'echo2\\[openenv\\]'"):
        task().make_env()


def test_behind_openenvs_own_server_the_episodes_are_the_in_process_ones(tiny_model_dir):
    port = free_port()
    server = subprocess.Popen([sys.executable, "-m", "echo2.envs.openenv_examples.serve", "--port", str(port)],
                              env={**os.environ, "PYTHONPATH": str(ROOT / "src")}, stdout=subprocess.DEVNULL,
                              stderr=subprocess.DEVNULL)
    try:
        remote = task(environment="", url=f"http://127.0.0.1:{port}", timeout_s=5.0)
        deadline = time.monotonic() + 60
        while True:  # the server imports and binds
            try:
                remote.check()
                break
            except (OSError, ConnectionError, TimeoutError):
                assert time.monotonic() < deadline and server.poll() is None, "the OpenEnv server did not start"
                time.sleep(0.5)
        local = task()
        codec = Codec.from_source(str(tiny_model_dir), local.cfg)
        played = {}
        for name, source in (("local", local), ("remote", remote)):
            episodes = [source.episode(codec, source.train_seed(i), 4) for i in range(6)]
            play(episodes, guesser(codec, random.Random(1)))
            played[name] = [(e.token_ids, e.segments, e.reward, e.illegal) for e in episodes]
        assert played["remote"] == played["local"]
        assert any(illegal for *_, illegal in played["remote"])  # the server's schema refused a reply too
    finally:
        server.terminate()
        server.wait(timeout=10)
