"""Generation engine interface: a worker hands prompts in, gets completions with per-token
behaviour log-probs out. Implemented: HF transformers (hf_engine.py, CPU/GPU) and vLLM
(vllm_engine.py); engine_factory.py picks one from the worker's config."""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Callable
from dataclasses import dataclass, field

from echo2.config.run import LoraConfig


@dataclass(frozen=True)
class GenRequest:
    prompt_ids: list[int]
    n: int
    """Completions to sample for this prompt (the GRPO group size)."""
    temperature: float
    max_new_tokens: int
    seed: int | None = None
    """The lease's sampler seed: an engine with `seeded = True` draws with the seeded sampler
    (models/sampler.py: sample i of the request is sample index first_sample + i, its k-th new
    token is at position first_position + k); None: its own sampling."""
    first_sample: int = 0
    """The sampler's sample index of this request's first completion (a multi-turn episode asks
    for one completion per turn: its index in the group)."""
    first_position: int = 0
    """The sampler's position of the first new token (a later turn of an episode continues its
    completion: the tokens before it, model's and environment's)."""


@dataclass(frozen=True)
class Completion:
    token_ids: list[int]
    logprobs: list[float]
    """log pi_behaviour(token | prefix) under the sampling distribution (after temperature)."""
    token_versions: list[tuple[int, int]] = field(default_factory=list)
    """Runs of (version, tokens) when the generation straddled versions (`InFlight`); empty:
    every token is the version it started with."""


@dataclass(frozen=True)
class InFlight:
    """How a generation in flight takes a newer version (sampling.segment_tokens): at every
    multiple of `segment_tokens` new tokens the engine asks `pending()` whether a newer version
    is verified and staged; if so it stops, calls `swap()` (blocking: the version is loaded into
    this engine; returns the version now held) and generates the rest under it from the tokens
    so far."""

    segment_tokens: int
    version: int
    """The version the generation starts with."""
    pending: Callable[[], bool]
    swap: Callable[[], int]


class Engine(ABC):
    seeded = False
    """Draws with the seeded sampler when a request carries a seed (the audit checks it)."""

    @abstractmethod
    def generate(self, requests: list[GenRequest], inflight: InFlight | None = None) -> list[list[Completion]]:
        """One list of `n` completions per request, in request order. Blocking. `inflight`: swap
        newer versions in at segment boundaries (an engine that cannot would ignore it and swap
        between generations only)."""

    @abstractmethod
    def load_state_dict(self, tensors: dict) -> None:
        """Swap in new policy weights (all tensors of the model, by name), cast to the engine's
        own dtype whatever dtype they travelled in."""

    def greedy(self, prompts: list[list[int]], max_new_tokens: int) -> list[list[int]]:
        """Greedy completions (token ids, up to and including EOS) of each prompt: what an
        evaluation lease asks for. Blocking."""
        raise NotImplementedError(f"the {type(self).__name__} engine cannot serve evaluation leases; set "
                                  "[evaluation] where = 'learner' or run workers with engine = 'hf' or 'vllm'")

    def load_adapter(self, tensors: dict, lora: LoraConfig) -> None:
        """Swap in new LoRA adapter weights (grpo.lora) on top of the base model loaded at start."""
        raise NotImplementedError(f"the {type(self).__name__} engine cannot apply LoRA adapters (grpo.lora); "
                                  "run workers with engine = 'hf'")
