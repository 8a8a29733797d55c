"""Task config schemas: what every task's config has (how many held-out problems to evaluate and
how prompts are rendered), each task's own fields on top, and `TaskConfig`, the run config's
[task] table, validated against the schema its `name` picks.

The schemas live here, not beside their adapters (echo2.tasks, echo2.envs), so that the run
config imports nothing above the config layer; a new task adds its schema here, to TASK_SCHEMAS,
and its adapter to echo2.tasks.registry (which checks that the two tables name the same tasks)."""

from __future__ import annotations

import re
from typing import Annotated, Any, ClassVar, Literal, Union

from pydantic import Field, field_validator, model_validator

from echo2.config.base import MAX_NEW_TOKENS, Frozen


class TaskConfigBase(Frozen):
    reference_format: ClassVar[int] = 1
    """The version of the task's reference completions (what the warm start imitates), part of
    a warm-started base's cache key (models/prepare.fingerprint): bump it when they change, so a
    base cached from the old ones is built again."""
    eval_size: int = Field(200, ge=1, le=100_000)
    """Held-out problems the learner evaluates (never used as training prompts); fewer if the
    held-out split has fewer."""
    chat_template: bool = True
    """Render prompts with the tokenizer's chat template when it has one (system prompt, then the
    question as the user's turn, then the assistant's turn to answer); false: the raw text."""
    chat_template_kwargs: dict[str, Any] = {}
    """Extra variables for the chat template, e.g. {enable_thinking = false} for Qwen3's."""
    system_prompt: str = Field("", max_length=20_000)
    """Optional system message (prepended as a line of text where there is no chat template)."""
    instruction: str | None = Field(None, max_length=20_000)
    """Appended to every question (e.g. how to format the answer); None: the task's own default."""


# ---- single-turn tasks (echo2.tasks) ------------------------------------------------------


class AdditionConfig(TaskConfigBase):
    name: Literal["addition"] = "addition"
    digits: int = Field(2, ge=1, le=6)
    """Operands have up to this many digits."""
    # 2: the reference pads a quarter more dots than pad_tokens; 3: pad_range puts the answer first
    reference_format: ClassVar[int] = 3
    pad_tokens: int = Field(0, ge=0, le=400)
    """Long completions for the tiny model: the answer comes after at least this many "."
    (the warm start imitates a quarter more, so a greedy policy is not at the edge of the rule:
    one dot fewer there would score 0), so every completion takes up to hundreds of tokens
    and generations straddle learner steps (benchmarks/inflight.py); a completion of fewer dots
    scores 0. 0: the bare answer."""
    pad_range: tuple[int, int] | None = None
    """Long completions of varied length (benchmarks/inflight.py): the answer, then dots. The warm
    start imitates, for each problem, a number of dots drawn log-uniform in [low, high] (once per
    problem, from the task's seed), so the policy's generation lengths, where it stops writing
    dots, have that long tail. The reward checks the answer and that only dots follow it, any
    number of them. None: pad_tokens."""
    chat_template: bool = False
    """The demo's prompts are the bare sum ("37+45="); set true to wrap them in a chat template."""

    @model_validator(mode="after")
    def _one_padding_rule(self) -> AdditionConfig:
        if self.pad_range is None:
            return self
        low, high = self.pad_range
        if not 1 <= low <= high <= 400:
            raise ValueError(f"task.pad_range = {list(self.pad_range)}: give [low, high] with 1 <= low <= high <= 400")
        if self.pad_tokens:
            raise ValueError(f"task.pad_tokens = {self.pad_tokens} and task.pad_range = {list(self.pad_range)}: "
                             "set one of them (pad_range draws each problem's padding; pad_tokens fixes it)")
        return self


class MathConfig(TaskConfigBase):
    name: Literal["math"] = "math"
    dataset: str = Field(min_length=1)
    """A Hugging Face dataset name (e.g. "openai/gsm8k"; hub access is the user's business) or a
    local .jsonl, .json, .parquet or .csv file."""
    dataset_config: str = ""
    """The hub dataset's configuration name (GSM8K's is "main")."""
    question_field: str = "question"
    answer_field: str = "answer"
    """Columns holding the problem and its answer (a bare answer, or a worked solution ending in
    \\boxed{...} or `#### answer`)."""
    train_split: str = "train"
    eval_split: str = ""
    """Held-out problems: a split of `dataset` (e.g. "test") or another local file; empty: hold
    out `eval_fraction` of the training rows."""
    eval_fraction: float = Field(0.05, gt=0, lt=1)
    format_reward: float = Field(0.0, ge=0, le=1)
    """Added to the reward when the completion states its answer in \\boxed{} (0: correctness
    only)."""


class ReasoningGymConfig(TaskConfigBase):
    name: Literal["reasoning_gym"] = "reasoning_gym"
    dataset: str = Field(min_length=1)
    """A reasoning-gym dataset name, e.g. "chain_sum", "basic_arithmetic", "sokoban"."""
    config: dict[str, Any] = {}
    """The dataset's own settings (e.g. chain_sum's min_terms, max_terms, min_digits,
    max_digits); see reasoning_gym's docs for each dataset."""
    size: int = Field(10_000, ge=1, le=10_000_000)
    """Training problems per epoch (generated on demand; each epoch is reshuffled)."""
    answer_pattern: str = Field("", max_length=256)
    """A regular expression that finds the answer in a completion without `<answer>` tags: its
    last match is scored (the first group's text where the pattern has a group), and a
    completion it does not match earns 0. "" scores the whole completion. For example
    "-?\\d+" (the last integer) for arithmetic datasets, whose answers are bare numbers."""
    partial_credit: bool = True
    """True: the dataset's score as it gives it, partial credit included (most datasets give
    len(answer)/len(completion) to a completion that contains the answer). False: 1.0 for full
    marks, else 0. A model whose habit earns partial credit (SmolLM2's "2 + 5 = 7" for "7") can
    collapse onto that habit, since it is the best-rewarded thing it samples; binary rewards
    leave it nothing to collapse onto. Held-out accuracy counts full marks either way."""

    @field_validator("answer_pattern")
    @classmethod
    def _compiles(cls, pattern: str) -> str:
        try:
            re.compile(pattern)
        except re.error as exc:
            raise ValueError(f"task.answer_pattern={pattern!r} is not a regular expression ({exc}); give one such as "
                             "'-?\\d+', or '' to score the whole completion") from None
        return pattern


# ---- multi-turn tasks (echo2.envs) --------------------------------------------------------

OpponentName = Literal["random", "calling_station", "equity"]


class EnvTaskConfigBase(TaskConfigBase):
    """What every multi-turn task has. `eval_size` is the number of held-out episodes per
    opponent; `sampling.max_new_tokens` bounds one action."""

    max_turns: int = Field(8, ge=1, le=1000)
    """Actions per episode: an episode still going after this many ends (truncated)."""
    max_episode_tokens: int = Field(256, ge=2, le=MAX_NEW_TOKENS)
    """Transcript tokens after the first prompt (actions and environment answers): an episode
    whose next environment answer would not leave room for an action ends (truncated). With
    the first prompt it must fit the model's context."""


class PokerConfig(EnvTaskConfigBase):
    name: Literal["poker"] = "poker"
    game: Literal["kuhn", "leduc"] = "kuhn"
    """"kuhn": 3 cards, one betting round, at most one bet. "leduc": 6 cards, a board card after
    the first round, two fixed-limit rounds of up to two bets each."""
    opponent: OpponentName = "random"
    """Who training episodes are played against: "random" (a uniformly random legal action),
    "calling_station" (always checks or calls), "equity" (raises with at least 65% equity
    against a random hand, calls above 40%, else checks or folds)."""
    eval_opponents: list[OpponentName] = Field(default_factory=lambda: ["random", "calling_station", "equity"],
                                               min_length=1)
    """Opponents `echo2 eval` and the learner's in-run evaluation play `eval_size` episodes each
    against (the in-run evaluation: the training opponent only)."""
    illegal_reward: float = Field(-1.0, ge=-10.0, le=0.0)
    """Reward of an action that is not a legal letter (the hand ends there); -1 equals losing a
    whole stack, worse than any legal line of play."""


class GuessNumberConfig(EnvTaskConfigBase):
    name: Literal["guess_number"] = "guess_number"
    high: int = Field(16, ge=2, le=1_000_000)
    """The secret is drawn from 1..high."""
    max_guesses: int = Field(6, ge=1, le=1000)
    """Guesses before the game is lost (reward 0)."""
    illegal_reward: float = Field(-1.0, ge=-10.0, le=0.0)
    """Reward of a guess that is not a number from 1 to high (the game ends there)."""


class JudgeEndpoint(Frozen):
    """`[task.judge]`: the OpenAI-compatible endpoint a verifiers environment's LLM judges call
    (the judges plugged into its tasks' config, `TaskConfig.judges`). Only the coordinator's
    scoring processes and the learner's evaluation call it: workers play with the judges taken
    out (their rewards are never used), so they never reach the endpoint or its key."""

    base_url: str = Field(min_length=1, max_length=2000, pattern=r"^https?://")
    model: str = Field(min_length=1, max_length=200)
    api_key_var: str = Field("ECHO2_JUDGE_API_KEY", pattern=r"^[A-Za-z_][A-Za-z0-9_]*$", max_length=100)
    """Environment variable holding the endpoint's API key where it is called (unset: none sent)."""
    timeout_s: float = Field(60.0, gt=0, le=3600)
    """Seconds one judge call may wait for its answer (connecting: at most 10 of them)."""


class VerifiersConfig(EnvTaskConfigBase):
    """A verifiers environment (`pip install 'echo2[verifiers]'`): its taskset's episodes played
    by echo2's agent loop against the workers' engines, rewarded by its own reward functions at
    the coordinator (echo2.envs.verifiers_*). The first `eval_size` tasks are held out; the rest
    are the training prompts, in an order drawn from the run seed. The environment supplies the
    prompts: `system_prompt`, `instruction` and `chat_template` are not used."""

    name: Literal["verifiers"] = "verifiers"
    environment: str = Field(min_length=1, max_length=500)
    """Import path of a module exporting one verifiers Taskset subclass in `__all__`
    ("package.module", or "package.module:ClassName"), installed on the coordinator and workers."""
    args: dict[str, Any] = {}
    """The taskset config's fields."""
    trust: Literal["replayable", "worker-trusted"]
    """How far its episodes can be checked, said explicitly. "replayable": the coordinator plays
    each submitted episode again with the worker's completions, runs the tools itself, refuses an
    episode whose environment tokens differ and computes the reward with the environment's own
    reward functions (a reward the worker sends is never used). "worker-trusted": for tools the
    coordinator cannot run (the network, a sandbox): the replay gives each tool call the answer
    the worker recorded, the tokens it renders must still equal the episode's, and the reward is
    still the environment's own; only workers holding the trusted-worker token (ECHO2_TRUSTED_TOKEN,
    <run_dir>/keys/trusted.token) may join, and the summary names them as what the rewards rest on."""
    renderer: str = "echo2.envs.verifiers_renderer.ExactRenderer"
    """verifiers' renderer: a name of the `renderers` package ("qwen3"...) or a class's import
    path. The default renders with the model's chat template and keeps the engine's exact ids
    across turns."""
    tool_parser: str | None = None
    """How tool calls are read from a completion: "hermes-text" (<tool_call> JSON blocks in the
    text, for tokenizers without tool tokens), a `renderers` parser ("qwen3"...), or None: no tools."""
    tool_timeout_s: float = Field(10.0, gt=0, le=600)
    """Seconds one tool call may take; past it the model is told the call timed out."""
    max_tool_output_chars: int = Field(2000, ge=1, le=1_000_000)
    episode_timeout_s: float = Field(120.0, gt=0, le=86_400)
    """Seconds one episode may take, turns, tools and scoring included."""
    judge: JudgeEndpoint | None = None
    """The endpoint of the environment's LLM judges; an environment that plugs judges into its
    tasks is refused without one."""


class OpenEnvConfig(EnvTaskConfigBase):
    """An OpenEnv environment (`pip install 'echo2[openenv]'`): an `openenv.core` Environment
    played turn by turn, the model's text as its action (`action_field`), its observation as the
    next user turn, its rewards summed over the steps (echo2.envs.openenv_env). Built in-process
    from `environment`, or reached through OpenEnv's own client at `url`, a server of it that runs
    on the machine of every process that plays (the coordinator's included: it replays each
    episode there). `reset(seed)` must draw everything from the seed: the coordinator replays
    every episode from its seed and the worker's actions, and refuses one whose observations differ."""

    name: Literal["openenv"] = "openenv"
    environment: str = Field("", max_length=500, pattern=r"^([A-Za-z_][\w.]*:[A-Za-z_]\w*)?$")
    """Import path of the Environment subclass ("package.module:ClassName"), built with `args`.
    Empty: `url` names a server."""
    args: dict[str, Any] = {}
    """Keyword arguments of the environment's constructor."""
    url: str = Field("", max_length=500, pattern=r"^(https?://(localhost|127\.0\.0\.1|\[::1\])(:\d+)?/?)?$")
    """An OpenEnv server on this machine (http://127.0.0.1:PORT), one on each machine that plays;
    empty: `environment` in-process. Only localhost: the environment's answers are what the
    coordinator checks, and a shared remote server would be one more party to trust."""
    action: str = Field("", max_length=500, pattern=r"^([A-Za-z_][\w.]*:[A-Za-z_]\w*)?$")
    """Import path of the environment's Action class; empty: the one its class declares
    (Environment[Action, Observation, State]). With `url`, unused: actions go as JSON."""
    action_field: str = Field("message", pattern=r"^[A-Za-z_]\w*$", max_length=100)
    """The Action field that takes the model's reply (its decoded text, stripped)."""
    observation_field: str = Field("", pattern=r"^([A-Za-z_]\w*)?$", max_length=100)
    """The Observation field shown to the model; empty: its only text field, or else all its
    fields but done, reward and metadata, as JSON."""
    trust: Literal["replayable", "worker-trusted"]
    """Said explicitly; "replayable" is the one an OpenEnv environment can have: the coordinator
    plays each episode again from its seed with the worker's actions and uses the rewards it gets
    itself. "worker-trusted" is refused: an OpenEnv reward comes out of the environment's own step,
    so for one the coordinator cannot run, the reward would be the worker's word (a verifiers
    environment recomputes its rewards from the transcript: bring such tools that way)."""
    demo_actions: list[str] = Field(default_factory=list, max_length=10_000)
    """Replies the format warm start imitates (drawn at random each turn); needed only with a
    warm start (the tiny model)."""
    illegal_reward: float = Field(-1.0, ge=-10.0, le=0.0)
    """Reward of a reply the Action class refuses (the episode ends there)."""
    timeout_s: float = Field(30.0, gt=0, le=3600)
    """With `url`: seconds to connect to the server, and to wait for each of its answers."""

    @field_validator("trust")
    @classmethod
    def _replayable(cls, trust: str) -> str:
        if trust != "replayable":
            raise ValueError("task.trust: an OpenEnv environment can only be \"replayable\": its rewards come out of "
                             "its own step, so where the coordinator cannot replay it they would be the worker's word; "
                             "make reset(seed) and step deterministic, or bring the environment as a verifiers "
                             "environment, whose worker-trusted tools are rewarded from the transcript")
        return trust

    @field_validator("url")
    @classmethod
    def _one_source(cls, url: str, info) -> str:
        environment = info.data.get("environment", "")
        if bool(url) == bool(environment):
            raise ValueError("task: give exactly one of environment (\"package.module:ClassName\", built in-process) "
                             f"and url (a local OpenEnv server); got environment={environment!r}, url={url!r}")
        return url


def trusted_workers_only(task: TaskConfigBase) -> bool:
    """The task's rewards rest on its workers' word (a worker-trusted environment): only workers
    holding the trusted-worker token join, and its replay takes their tool answers."""
    return getattr(task, "trust", None) == "worker-trusted"


TASK_SCHEMAS: dict[str, type[TaskConfigBase]] = {
    "addition": AdditionConfig,
    "math": MathConfig,
    "reasoning_gym": ReasoningGymConfig,
    "poker": PokerConfig,
    "guess_number": GuessNumberConfig,
    "verifiers": VerifiersConfig,
    "openenv": OpenEnvConfig,
}
"""Task name -> its schema (the adapters are echo2.tasks.registry's TASKS)."""

TaskConfig = Annotated[Union[tuple(TASK_SCHEMAS.values())], Field(discriminator="name")]  # noqa: UP007
