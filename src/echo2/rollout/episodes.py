"""Multi-turn rollouts on a worker: each leased group is G episodes from the lease's episode
seed, played turn by turn with the engine (every live episode's next action in one batch), each
transcript rendered through the model's chat template exactly as the coordinator will replay it.

Every turn draws with the lease's sampler seed as one continuing completion: episode j of the
group is the sampler's sample j, and an action's first token sits at the position its
transcript has reached (the model's and the environment's tokens before it), which is the
token's index in the completion the learner's audit recomputes.

With in-flight weight updates (sampling.segment_tokens) a newer version is swapped in between
turns (never before the first action, whose tokens carry the lease's version) and within an
action at the engine's segment boundaries; each token keeps the version that sampled it, and an
environment's answer the version of the action before it (context, never trained)."""

from __future__ import annotations

from dataclasses import replace

from echo2.config.task import TaskConfig
from echo2.envs.episode import Episode
from echo2.envs.play import play_turns
from echo2.envs.task import EnvTask
from echo2.envs.transcript import Codec
from echo2.protocol.messages import RolloutCompletion, Task
from echo2.protocol.token_versions import encode, expand
from echo2.rollout.engine import Engine, GenRequest, InFlight


def env_task_from(cfg: TaskConfig | None) -> EnvTask | None:
    """The run's multi-turn task from the coordinator's registration reply (None: single-turn)."""
    if cfg is None:
        return None
    from echo2.tasks.registry import make_task

    # the run seed only picks held-out episodes, which a worker never plays: leases bring the seeds
    task = make_task(cfg, seed=0)
    if task.kind != "episode":
        raise ValueError(f"the coordinator sent task {cfg.name!r} as multi-turn, but it is not")
    return task


def episode_player(engine: Engine, cfg: TaskConfig | None, model_source: str, max_new_tokens: int):
    """What plays the run's multi-turn leases: an EpisodePlayer (echo2's environments), an
    AgentPlayer (a verifiers environment) or None (single-turn). Blocking: an environment is
    imported and its tasks loaded."""
    if cfg is None:
        return None
    if cfg.name == "verifiers":
        from echo2.envs.verifiers_task import VerifiersTask
        from echo2.rollout.agent_episodes import AgentPlayer

        return AgentPlayer(engine, VerifiersTask(cfg, seed=0), model_source, max_new_tokens)
    return EpisodePlayer(engine, env_task_from(cfg), model_source)


class EpisodePlayer:
    def __init__(self, engine: Engine, task: EnvTask, model_source: str) -> None:
        self.engine, self.task = engine, task
        self.codec = Codec.from_source(model_source, task.cfg)

    def play(self, tasks: list[Task], inflight: InFlight | None = None) -> list[list[Episode]]:
        """G finished episodes per leased task, in lease order. Raises ValueError when the first
        prompt this worker renders is not the coordinator's (another tokenizer or template).
        `inflight`: newer versions swap in between turns and at segment boundaries; each
        episode's `token_versions` says which sampled what (`TurnVersions`)."""
        groups = [self._start(t) for t in tasks]
        temperature = tasks[0].sampling.temperature
        episodes = [e for group in groups for e in group]
        # each episode's sampler seat, beside it: the lease's seed and the episode's index in its group
        seats = [(t.sampling_seed, j) for t, group in zip(tasks, groups, strict=True) for j in range(len(group))]
        versions = TurnVersions(episodes, inflight)

        def policy(live: list[int]):
            turn = versions.before_turn(live)
            requests = [GenRequest(episodes[i].context_ids(), 1, temperature, episodes[i].action_budget(),
                                   seed=seats[i][0], first_sample=seats[i][1],
                                   first_position=len(episodes[i].token_ids)) for i in live]
            actions = [c[0] for c in self.engine.generate(requests, turn)]
            versions.after_turn(live, actions)
            return [(c.token_ids, c.logprobs) for c in actions]

        play_turns(episodes, policy)
        versions.finish()
        return groups

    def groups(self, tasks: list[Task], inflight: InFlight | None = None) -> list[list[RolloutCompletion]]:
        return [[completion(e) for e in group] for group in self.play(tasks, inflight)]

    def close(self) -> None:
        pass
    def _start(self, task: Task) -> list[Episode]:
        if task.episode_seed is None:
            raise ValueError(f"lease {task.lease_id} has no episode seed, but the run's task is multi-turn")
        episodes = [self.task.episode(self.codec, task.episode_seed, task.sampling.max_new_tokens)
                    for _ in range(task.sampling.group_size)]
        if episodes[0].prompt_ids != task.prompt_ids:
            raise ValueError(f"lease {task.lease_id}: the first prompt rendered here differs from the coordinator's "
                             "(a different tokenizer or chat template?): this worker must load the run's model")
        return episodes


class TurnVersions:
    """The version behind each transcript token of a lease's episodes, as they are played with
    in-flight updates (`inflight`; None: one version plays everything, nothing is tracked)."""

    def __init__(self, episodes: list[Episode], inflight: InFlight | None) -> None:
        self.episodes, self.inflight = episodes, inflight
        self.held = inflight.version if inflight is not None else 0
        self.per_token: list[list[int]] = [[] for _ in episodes]

    def before_turn(self, live: list[int]) -> InFlight | None:
        """Swap a staged newer version in before this turn's actions (not before the first: the
        submission's version is the one the episodes started with); the turn's InFlight."""
        if self.inflight is None:
            return None
        if any(self.episodes[i].token_ids for i in live) and self.inflight.pending():
            self.held = self.inflight.swap()
        for i in live:
            self._cover(i)
        return replace(self.inflight, version=self.held)

    def after_turn(self, live: list[int], actions: list) -> None:
        if self.inflight is None:
            return
        for i, action in zip(live, actions, strict=True):
            self.per_token[i] += expand(action.token_versions, len(action.token_ids), self.held)
        # the engine may have swapped at a segment boundary: the newest version any token has
        self.held = max([self.held] + [self.per_token[i][-1] for i in live if self.per_token[i]])

    def finish(self) -> None:
        for i, episode in enumerate(self.episodes):
            if self.inflight is not None:
                self._cover(i)
            episode.token_versions = encode(self.per_token[i])

    def _cover(self, i: int) -> None:
        """The environment's answer after the last action: that action's version."""
        missing = len(self.episodes[i].token_ids) - len(self.per_token[i])
        self.per_token[i] += [self.per_token[i][-1] if self.per_token[i] else self.held] * missing


def completion(episode: Episode) -> RolloutCompletion:
    return RolloutCompletion(token_ids=episode.token_ids, logprobs=episode.logprobs, segments=episode.segments,
                             token_versions=episode.token_versions)


def sample_groups(engine: Engine, episodes, tasks: list[Task],
                  inflight: InFlight | None = None) -> list[list[RolloutCompletion]]:
    """Blocking: G completions per leased task, or G episodes per task for a multi-turn task.
    `inflight`: generations take newer versions at segment boundaries (episodes also
    between turns)."""
    if episodes is not None:  # an EpisodePlayer or an AgentPlayer (episode_player)
        return episodes.groups(tasks, inflight)
    requests = [GenRequest(t.prompt_ids, t.sampling.group_size, t.sampling.temperature, t.sampling.max_new_tokens,
                           seed=t.sampling_seed) for t in tasks]
    return [[RolloutCompletion(token_ids=c.token_ids, logprobs=c.logprobs, token_versions=c.token_versions)
             for c in group] for group in engine.generate(requests, inflight)]
