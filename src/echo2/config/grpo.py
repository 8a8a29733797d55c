"""The learner's objective and optimizer (`[grpo]`), and LoRA adapters (`[grpo.lora]`)."""

from __future__ import annotations

from typing import Literal

from pydantic import Field, model_validator

from echo2.config.base import Frozen


class LoraConfig(Frozen):
    """Low-rank adapters (peft LoRA): the learner trains only them on the frozen base, and each
    version carries only the adapter weights (at r = 16 on every linear layer, ~1% of a full
    bf16 version); workers apply them to the base they hold."""

    r: int = Field(16, ge=1, le=4096)
    """Rank of each adapter: its bytes grow linearly with r."""
    alpha: float = Field(32.0, gt=0)
    """Scale numerator: the adapter's update is (alpha / r) * B @ A."""
    target_modules: tuple[str, ...] = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")
    """Names of the linear layers that get adapters (Qwen3 and Llama names; every linear layer of
    a block by default)."""

    @model_validator(mode="after")
    def _targets(self) -> LoraConfig:
        if not self.target_modules or any(not name or len(name) > 128 for name in self.target_modules):
            raise ValueError(f"grpo.lora.target_modules={list(self.target_modules)!r}: give one or more module names "
                             "such as 'q_proj'")
        return self


Objective = Literal["tis", "dapo", "bnpo", "grpo", "dr_grpo", "gspo", "cispo", "clip"]


class GRPOConfig(Frozen):
    prompts_per_step: int = Field(16, ge=1)
    """Groups per learner step; B = prompts_per_step x group_size rollouts."""
    lr: float = Field(5e-4, gt=0)
    weight_decay: float = Field(0.0, ge=0)
    max_grad_norm: float = Field(1.0, gt=0)
    loss: Objective = "tis"
    """The objective, by the name users know it from TRL, verl and the papers (formulas and
    sources: learner/objectives.py and the README's table). "tis" (default): decoupled objective,
    clipped ratio against the proximal (current) policy times a truncated importance weight
    pi_prox/pi_behav <= tis_cap; "dapo" and "bnpo" are the same. "grpo": each completion's mean,
    then the mean over completions. "dr_grpo": a constant normaliser (B x max_new_tokens).
    "gspo": a sequence-level, length-normalised ratio and weight. "cispo": the capped importance
    weight times log pi, gradient through log pi only. "clip": PPO-clipped token ratio against
    the worker's behaviour log-probs, dual-clipped at tis_cap for negative advantages; on stale
    groups the tokens the policy already learned fall outside the clip range and carry no
    gradient, so it learns more slowly than "tis" from stale groups
    (benchmarks/real_model_learning.py compares the two)."""
    advantage_scaling: Literal["auto", "group", "batch", "none"] = "auto"
    """How advantages r - mean(group) are scaled: "group" by the group's reward std (GRPO),
    "batch" by the std of the step's rewards (TRL's scale_rewards="batch"), "none" not at all
    (Dr. GRPO: std scaling favours questions that are too easy or too hard). "auto": "none" for
    loss = "dr_grpo", else "group"."""
    clip_low: float = Field(0.2, gt=0, lt=1)
    clip_high: float = Field(0.28, gt=0)
    tis_cap: float = Field(2.0, gt=1)
    """Upper bound on the importance weight of stale tokens; bounds each token's gradient (the
    dual clip's floor for "clip", TRL's epsilon_high for "cispo")."""
    kl_coef: float = Field(0.0, ge=0)
    """KL penalty to the frozen starting policy (k3 estimator); 0 disables the reference model."""
    micro_batch_tokens: int = Field(16_384, ge=0)
    """Token budget of one forward/backward pass: sequences are sorted by length and packed into
    micro-batches of at most this many prompt+completion tokens as computed (a shared prompt
    once, padding included), and their gradients accumulate into one optimizer step equal to
    the full-batch step. Activation memory follows
    this budget, not the batch size. A sequence longer than the budget gets a pass of its own.
    0: the whole batch in one pass."""
    logprob_chunk_tokens: int = Field(1024, ge=1)
    """Completion tokens whose full-vocabulary logits exist at once while token log-probs are
    computed (and recomputed in the backward pass): 1024 x 151,936 (Qwen3's vocabulary) x 4 B is
    622 MB per fp32 buffer. The [B, T, V] logits of the batch are never held."""
    share_prompts: bool = True
    """Compute each group's prompt once and its G completions on top of the prompt's key/value
    cache (gradients equal to the unshared computation). With a chat template the prompt is
    most of every sequence, so the learner computes several times fewer tokens per step.
    Models that cannot (sliding-window attention, activation
    checkpointing, a sharded learner) take packed rows instead, without padding."""
    lora: LoraConfig | None = None
    """Train LoRA adapters instead of every weight (`{r, alpha, target_modules}`); None: full
    fine-tuning. Versions then carry the adapters only."""
    drop_uninformative_groups: bool = True
    """Dynamic sampling (DAPO): a scored group whose rewards all equal each other (after overlong
    shaping) has zero advantage under group normalisation and teaches nothing, so the
    coordinator counts it and never sends it to the learner; its prompt counts as done and the
    lease window refills the batch with other prompts, so every step still trains
    prompts_per_step informative groups. The worker is credited for it as delivered work. The
    learner's rollout audit never sees such groups (they never reach it). False: they reach the
    learner with zero advantage, as before (a run whose model solves all or none of a prompt's
    completions then still takes steps)."""
    overlong_buffer_tokens: int = Field(0, ge=0)
    """DAPO's soft overlong punishment: with L = sampling.max_new_tokens, a completion of n
    tokens with L - overlong_buffer_tokens < n <= L has (n - (L - buffer)) / buffer x
    overlong_penalty taken off its reward (the whole penalty at n = L: a completion cut off at
    the cap); shorter ones are untouched. Must be below sampling.max_new_tokens. 0: off."""
    overlong_penalty: float = Field(1.0, ge=0)
    """The largest overlong penalty, reached at n = sampling.max_new_tokens (in reward units)."""

    @property
    def advantage_scale(self) -> str:
        """advantage_scaling with "auto" resolved."""
        if self.advantage_scaling == "auto":
            return "none" if self.loss == "dr_grpo" else "group"
        return self.advantage_scaling
