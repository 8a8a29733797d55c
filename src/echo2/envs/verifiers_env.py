"""A verifiers environment loaded for echo2: its taskset from an import path, its episodes
played with echo2's agent loop (`verifiers_harness`) and renderer (`verifiers_renderer`)
through the turn server (`verifiers_play`), and replayed from a submitted transcript.

One `VerifiersEpisodes` per process that plays or replays (a worker, a scoring process): it
loads the taskset once, serves the generate endpoint on 127.0.0.1 and keeps one verifiers
`Agent` (one renderer pool) for every episode."""

from __future__ import annotations

import importlib
from collections.abc import Sequence
from contextlib import AsyncExitStack
from dataclasses import dataclass, replace
from typing import Any

from echo2.config.task import JudgeEndpoint
from echo2.envs.episode import ReplayMismatch
from echo2.envs.verifiers_judges import judged_tasks
from echo2.envs.verifiers_play import Answer, PlayedEpisode, TurnServer, check_replayed, play_episodes, playback

RENDERER = "echo2.envs.verifiers_renderer.ExactRenderer"
MODEL_NAME = "echo2-policy"  # what the agent calls the model; the turn server serves only it
START_TIMEOUT_S = 120.0
"""The longest the taskset's tool servers may take to start (a process each, on a loaded machine):
a start is not an episode, so task.episode_timeout_s does not bound it unless it is longer."""


class EnvironmentLoadError(ValueError):
    """The environment cannot be loaded: one line naming the field, the value and the fix."""


@dataclass(frozen=True)
class VerifiersSpec:
    environment: str
    """Import path of a module exporting one verifiers Taskset subclass in `__all__`
    (`module` or `module:ClassName`)."""
    args: dict[str, Any]
    """Fields of the taskset's config."""
    max_turns: int
    max_new_tokens: int
    """Tokens of one completion."""
    max_episode_tokens: int | None = None
    """Tokens after the first prompt; an episode that reaches it ends (None: no bound)."""
    renderer: str = RENDERER
    """verifiers' renderer: a renderer name of the `renderers` package ("qwen3", "default"...) or
    the import path of a renderer class; echo2's ExactRenderer (the model's chat template, exact
    ids across turns) by default."""
    tool_parser: str | None = None
    tool_timeout_s: float = 10.0
    max_tool_output_chars: int = 2000
    episode_timeout_s: float = 300.0
    judge: JudgeEndpoint | None = None
    """Where the tasks' LLM judges are pointed (`verifiers_judges`)."""
    run_judges: bool = True
    """False: the judges are taken out (a worker's side: its rewards are never used)."""
    trust: str = "replayable"
    """"worker-trusted": a replay gives the tool calls the worker's recorded answers (its tools
    cannot run where it is replayed); "replayable": the replay runs the tools itself."""


def taskset_class(environment: str):
    """The Taskset subclass `environment` names; EnvironmentLoadError when it names none."""
    import verifiers.v1 as vf

    module_name, _, class_name = environment.partition(":")
    try:
        module = importlib.import_module(module_name)
    except ImportError as exc:
        raise EnvironmentLoadError(f"task.environment = {environment!r}: cannot import {module_name!r} ({exc}); "
                                "install the package that provides it on the coordinator and the workers") from exc
    if class_name:
        found = [getattr(module, class_name, None)]
    else:
        found = [getattr(module, name, None) for name in getattr(module, "__all__", [])]
    found = [c for c in found if isinstance(c, type) and issubclass(c, vf.Taskset) and c is not vf.Taskset]
    if len(found) != 1:
        where = f"{class_name!r} in it" if class_name else "exactly one Taskset subclass in its __all__"
        raise EnvironmentLoadError(f"task.environment = {environment!r}: the module needs {where} "
                                f"(found {len(found)}); name the class as 'module:ClassName'")
    return found[0]


def load_tasks(environment: str, args: dict[str, Any]) -> list:
    """Every task of the taskset, in its order (the order echo2 numbers prompts in)."""
    return load_taskset(environment, args)[1]


def load_taskset(environment: str, args: dict[str, Any]) -> tuple[Any, list]:
    """The taskset (its shared tools) and every task of it, in its order."""
    from pydantic import ValidationError
    from verifiers.v1 import Taskset, TasksetConfig
    from verifiers.v1.utils.generic import concrete_type

    cls = taskset_class(environment)
    config_cls = concrete_type(cls, TasksetConfig, origin=Taskset) or TasksetConfig
    try:
        config = config_cls.model_validate(args)
    except ValidationError as exc:
        first = exc.errors()[0]
        field = ".".join(str(part) for part in first["loc"])
        raise EnvironmentLoadError(f"task.args.{field}: {first['msg']} (the fields of {config_cls.__name__})") from None
    try:
        taskset = cls(config)
        tasks = list(taskset)
    except Exception as exc:  # the environment's own code: whatever it raises is the user's to see
        raise EnvironmentLoadError(f"task.environment = {environment!r} failed to load its tasks: "
                                f"{type(exc).__name__}: {exc}") from exc
    if not tasks:
        raise EnvironmentLoadError(f"task.environment = {environment!r} has no tasks with task.args = {args!r}")
    return taskset, tasks


def renderer_config(renderer: str, tool_parser: str | None):
    """The `renderers` config for a name or a class's import path; ValueError naming the field."""
    from pydantic import TypeAdapter, ValidationError
    from renderers import CustomRendererConfig, RendererConfig
    from renderers.parsers import TOOL_PARSERS

    from echo2.envs.verifiers_renderer import HERMES_TEXT

    parsers = sorted([*TOOL_PARSERS, HERMES_TEXT])
    if tool_parser is not None and tool_parser not in parsers:
        raise EnvironmentLoadError(f"task.tool_parser = {tool_parser!r} is not a tool parser (allowed: "
                                   f"{', '.join(parsers)}); {HERMES_TEXT!r} reads <tool_call> JSON blocks from text")
    if tool_parser == HERMES_TEXT and "." not in renderer and ":" not in renderer:
        raise EnvironmentLoadError(f"task.tool_parser = {HERMES_TEXT!r} belongs to echo2's renderer ({RENDERER} "
                                   f"or a subclass), not to task.renderer = {renderer!r}; leave task.renderer "
                                   "unset or pick another parser")
    extra = {"tool_parser": tool_parser} if tool_parser else {}
    try:
        if "." in renderer or ":" in renderer:
            return CustomRendererConfig(import_path=renderer, **extra)
        return TypeAdapter(RendererConfig).validate_python({"name": renderer, **extra})
    except (ValidationError, ValueError, TypeError, ImportError) as exc:
        reason = exc.errors()[0]["msg"] if isinstance(exc, ValidationError) else str(exc).splitlines()[0]
        raise EnvironmentLoadError(f"task.renderer = {renderer!r} (tool_parser {tool_parser!r}): {reason}; use a "
                                   "renderer name of the renderers package or a class's import path") from None


class _FirstPrompt(Exception):
    """Ends a dry run at its first model call, carrying the prompt."""


class VerifiersEpisodes:
    def __init__(self, spec: VerifiersSpec, tokenizer_dir: str, loaded: tuple[Any, list] | None = None) -> None:
        """`loaded`: the taskset and its tasks, if loaded already (`load_taskset`)."""
        from transformers import PreTrainedTokenizerFast

        self.spec, self.tokenizer_dir = spec, tokenizer_dir
        taskset, tasks = loaded if loaded is not None else load_taskset(spec.environment, spec.args)
        self.taskset, self.tasks = taskset, judged_tasks(tasks, spec.judge, run_judges=spec.run_judges)
        tokenizer = PreTrainedTokenizerFast.from_pretrained(tokenizer_dir)
        self.server = TurnServer([tokenizer.eos_token_id] if tokenizer.eos_token_id is not None else [])
        self.agent = None
        self.shared_tools: dict = {}
        self._serving = AsyncExitStack()
        """The shared tool servers and the interception server, closed on the turn server's loop."""
        self._first_prompts: dict[int, list[int]] = {}

    def __enter__(self) -> VerifiersEpisodes:
        self.server.__enter__()
        try:
            self.agent = self.server.run(self._serve(), timeout_s=max(START_TIMEOUT_S, self.spec.episode_timeout_s))
        except BaseException:
            self.__exit__(None, None, None)
            raise
        return self

    def __exit__(self, *exc) -> None:
        try:
            self.server.run(self._serving.aclose(), timeout_s=60.0)
        finally:
            self.server.__exit__(*exc)

    async def _serve(self):
        """The agent, with what it serves every episode through, started once as verifiers' own
        `Env.serving` starts them: the taskset's shared tool servers (`Taskset.toolsets`; a task's
        own, `Task.toolsets`, is a process started for each episode) and one interception server
        for the episodes' model calls, which otherwise verifiers starts (an HTTP server with its
        own model client) for every episode."""
        from verifiers.v1.interception import InterceptionServer
        from verifiers.v1.mcp import serve_shared

        toolsets = type(self.taskset).toolsets(self.taskset.config)
        if toolsets:
            self.shared_tools = await self._serving.enter_async_context(serve_shared(toolsets))
        state_secrets = tuple(tool.state_secret for tool in self.shared_tools.values() if tool.state_secret)
        interception = await self._serving.enter_async_context(InterceptionServer(state_service_secrets=state_secrets))
        return self._agent(interception)

    def _agent(self, interception):
        import verifiers.v1 as vf
        from verifiers.v1.configs.agent import TimeoutConfig as AgentTimeouts

        from echo2.envs.verifiers_harness import Echo2HarnessConfig

        spec = self.spec
        renderer = renderer_config(spec.renderer, spec.tool_parser)
        client = vf.TrainClientConfig(base_url=self.server.base_url, api_key_var="ECHO2_VERIFIERS_UNUSED_KEY",
                                      renderer=renderer, renderer_model_name=self.tokenizer_dir)
        harness = Echo2HarnessConfig(tool_timeout=spec.tool_timeout_s, max_tool_output_chars=spec.max_tool_output_chars)
        return vf.Agent(vf.AgentConfig(
            harness=harness, runtime=vf.SubprocessConfig(), model=MODEL_NAME, client=client,
            sampling=vf.SamplingConfig(max_tokens=spec.max_new_tokens), max_turns=spec.max_turns,
            timeout=AgentTimeouts(rollout=spec.episode_timeout_s, scoring=spec.episode_timeout_s)),
            interception=interception)

    def task(self, index: int):
        return self.tasks[index % len(self.tasks)]

    def play(self, task_indices: Sequence[int], answer: Answer, *, max_episode_tokens: int | None = None,
             tool_playback: Sequence[list[str]] | None = None) -> list[PlayedEpisode]:
        """One episode per index (repeat an index for a group), every turn answered by `answer`;
        `max_episode_tokens`: a tighter budget than the spec's; `tool_playback`: per episode, the
        answers its tool calls get instead of running the tools."""
        budget = self.spec.max_episode_tokens if max_episode_tokens is None else max_episode_tokens
        return play_episodes(self.server, self.agent, [self.task(i) for i in task_indices], answer,
                             timeout_s=self.spec.episode_timeout_s, max_episode_tokens=budget,
                             tools=self.shared_tools, tool_playback=tool_playback)

    def first_prompt(self, task_index: int) -> list[int]:
        """The token ids of the task's first prompt, as its episodes will render it (a dry run to
        its first model call, remembered)."""
        index = task_index % len(self.tasks)
        if index not in self._first_prompts:
            def stop(calls):
                raise _FirstPrompt(calls[0].prompt_ids)
            try:
                self.play([index], stop)
            except _FirstPrompt as first:
                self._first_prompts[index] = list(first.args[0])
            else:
                raise EnvironmentLoadError(f"task.environment = {self.spec.environment!r}: task {index} ended "
                                           "before asking the model anything")
        return list(self._first_prompts[index])

    def known_first_prompt(self, task_index: int) -> list[int] | None:
        """The task's first prompt if a dry run has made it already; None otherwise."""
        made = self._first_prompts.get(task_index % len(self.tasks))
        return None if made is None else list(made)

    def replay(self, task_index: int, submitted: Sequence[PlayedEpisode]) -> list[float]:
        """Each submitted episode's reward, from playing the task again with the submitted
        completions (and, worker-trusted, its tool answers); ReplayMismatch when any environment
        segment, or where it ends, differs."""
        expected = [replace(e, reward=0.0, ended="", errors=[]) for e in submitted]
        answers = [e.tool_answers for e in submitted] if self.spec.trust == "worker-trusted" else None
        replayed = self.play([task_index] * len(expected), playback(expected), tool_playback=answers)
        check_replayed(expected, replayed)
        return [episode.reward for episode in replayed]


__all__ = ["EnvironmentLoadError", "ReplayMismatch", "VerifiersEpisodes", "VerifiersSpec", "load_taskset",
           "load_tasks"]
