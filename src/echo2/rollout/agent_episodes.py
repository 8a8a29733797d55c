"""Verifiers episodes on a worker (task kind "agent"): each leased group is G episodes of the
task the lease names, played by the environment's agent loop (echo2.envs.verifiers_play), every
turn's model calls answered in one batch by the engine.

As for echo2's own environments (rollout.episodes), every turn draws with the lease's sampler
seed as one continuing completion: episode j of the group is the sampler's sample j, and a
completion's first token sits at the position its transcript has reached after the first
prompt. The weights stay one version for the whole lease (a newer one is swapped in after it)."""

from __future__ import annotations

from echo2.envs.verifiers_play import Action, GenerationCall
from echo2.envs.verifiers_task import VerifiersTask
from echo2.protocol.messages import RolloutCompletion, Task
from echo2.rollout.engine import Engine, GenRequest


class EpisodesFailed(RuntimeError):
    """An episode of the lease ended before the model's first turn (its environment failed to
    start): the lease cannot be submitted whole; it expires and goes to another worker."""


class AgentPlayer:
    def __init__(self, engine: Engine, task: VerifiersTask, model_source: str, max_new_tokens: int) -> None:
        """Blocking (imports the environment, loads its tasks, starts its shared tools): build it
        off the event loop."""
        self.engine, self.task = engine, task
        # without the LLM judges: a worker's rewards are never used, and it has no judge endpoint
        self.episodes = task.episodes(model_source, max_new_tokens, run_judges=False).__enter__()

    def close(self) -> None:
        self.episodes.__exit__(None, None, None)

    def groups(self, tasks: list[Task], inflight=None) -> list[list[RolloutCompletion]]:  # noqa: ARG002
        """G episodes per leased task, in lease order. Raises ValueError when the first prompt
        this worker renders is not the coordinator's (another tokenizer, template or
        environment version)."""
        seats, indices = [], []
        for task in tasks:
            if task.episode_seed is None:
                raise ValueError(f"lease {task.lease_id} names no task of the environment (episode_seed)")
            for j in range(task.sampling.group_size):
                seats.append((task, j))
                indices.append(task.episode_seed)
        first_length: dict[int, int] = {}

        def answer(calls: list[GenerationCall]) -> list[Action]:
            requests = []
            for call in calls:
                task, j = seats[call.episode]
                first_length.setdefault(call.episode, len(call.prompt_ids))
                if len(call.prompt_ids) == first_length[call.episode] and call.prompt_ids != task.prompt_ids:
                    raise ValueError(f"lease {task.lease_id}: the first prompt rendered here differs from the "
                                     "coordinator's (a different tokenizer, chat template or environment version?): "
                                     "this worker must load the run's model and environment")
                requests.append(GenRequest(call.prompt_ids, 1, task.sampling.temperature,
                                           min(call.max_tokens, task.sampling.max_new_tokens), seed=task.sampling_seed,
                                           first_sample=j,
                                           first_position=len(call.prompt_ids) - first_length[call.episode]))
            return [(c[0].token_ids, c[0].logprobs) for c in self.engine.generate(requests)]

        played = self.episodes.play(indices, answer)
        for k, episode in enumerate(played):
            if not episode.segments:
                raise EpisodesFailed(f"lease {seats[k][0].lease_id}: episode {seats[k][1]} ended before the model's "
                                     f"first turn: {'; '.join(episode.errors) or episode.ended}")
        # a worker-trusted environment's replay gives its tool calls these answers (task.trust)
        trusted = self.episodes.spec.trust == "worker-trusted"
        completions = [RolloutCompletion(token_ids=e.token_ids, logprobs=e.logprobs, segments=e.segments,
                                         tool_answers=e.tool_answers if trusted else []) for e in played]
        size = [t.sampling.group_size for t in tasks]
        return [completions[sum(size[:i]):sum(size[:i + 1])] for i in range(len(tasks))]
