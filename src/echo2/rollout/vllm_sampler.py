"""The seeded sampler (models/sampler.py) inside vLLM's V1 engine, as a custom logits processor
(vLLM 0.32: `LLM(logits_processors=[...])`, v1/sample/logits_processor/interface.py).

A seeded request runs greedy (temperature 0) and names its lease's seed, its sampler sample
index, its first position and its sampling temperature in `SamplingParams.extra_args`. The
processor is not argmax-invariant, so vLLM's sampler applies it to the float32 logits before
greedy decoding (`Sampler.apply_logits_processors`, step 5 of v1/sample/sampler.py); with
penalties, bad words and allowed-token lists off nothing else changes the logits after it, and
the greedy argmax takes the token it leaves standing. It writes, for each seeded row, -inf
everywhere but at the seeded sampler's choice, which gets that token's log-prob under
softmax(logits / T): with the engine's `logprobs_mode = "processed_logits"`, an all-greedy batch
reports the processed logits as the log-probs (`Sampler.sample`), so the log-prob vLLM returns
for the token is the behaviour log-prob the learner compares against.

This module imports vLLM only inside its functions (the normal tier, without vLLM, imports and
tests it): `processor_class()` gives the processor class, `SeededRows` on vLLM's `LogitsProcessor`.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import cache

import torch

from echo2.models.sampler import check_seed, draw

EXTRA_KEY = "echo2_seeded_sampler"
"""The `SamplingParams.extra_args` entry a seeded request carries (`seeded_request`)."""
ROWS_PER_CHUNK = 16
"""Rows whose noise is computed at once: the hash's int64 temporaries are several (rows, vocab)
tensors, a few hundred MB for 256 rows of a 150k vocabulary."""


def seeded_request(*, seed: int, sample: int, first_position: int, temperature: float, max_tokens: int,
                   logprobs: bool = True):
    """One completion drawn by the processor: greedy over its output, the sampler's indices and
    temperature in extra_args, the chosen token's log-prob returned (logprobs=0: that token only)."""
    from vllm import SamplingParams

    if temperature <= 0:
        raise ValueError("the seeded sampler needs sampling.temperature > 0 (0 is greedy: nothing to seed)")
    spec = {"seed": check_seed(seed), "sample": sample, "first_position": first_position,
            "temperature": float(temperature)}
    return SamplingParams(n=1, temperature=0.0, max_tokens=max_tokens, logprobs=0 if logprobs else None,
                          detokenize=False, extra_args={EXTRA_KEY: spec})


@dataclass(frozen=True)
class _Row:
    seed: int
    sample: int
    first_position: int
    temperature: float
    output_ids: list[int]
    """vLLM's running list of the request's output tokens (BatchUpdate hands a reference that
    stays live): its length is the position of the token being drawn, less first_position."""


def seeded_row(params, prompt_ids: list[int] | None, output_ids: list[int]) -> _Row | None:
    """The state of a request vLLM adds to the batch (`BatchUpdate.added`): None unless seeded."""
    spec = (params.extra_args or {}).get(EXTRA_KEY)
    if spec is None:
        return None  # an unseeded request (evaluation's greedy completions): left alone
    return _Row(spec["seed"], spec["sample"], spec["first_position"], spec["temperature"], output_ids)


class SeededRows:
    """The processor's work, apart from vLLM's base class: per batch row of a seeded request,
    the logits become -inf but at the seeded sampler's token, which holds its log-prob under
    softmax(logits / T)."""

    def __init__(self, vllm_config=None, device: torch.device | None = None, is_pin_memory: bool = False) -> None:
        self.rows: dict[int, _Row] = {}
        """Batch index -> the seeded request in that row."""

    @classmethod
    def validate_params(cls, sampling_params) -> None:
        spec = (sampling_params.extra_args or {}).get(EXTRA_KEY)
        if spec is not None and sampling_params.temperature != 0:
            # at T > 0 vLLM would sample the processed scores again, and report other log-probs
            raise ValueError(f"{EXTRA_KEY} requests must run at temperature 0 (greedy over the processor's scores)")

    def is_argmax_invariant(self) -> bool:
        return False  # it picks the token greedy decoding takes: applied before greedy sampling

    def update_state(self, batch_update) -> None:
        """Rows added, removed and moved, as vLLM's own sparse processors keep theirs."""
        from vllm.v1.sample.logits_processor.builtin import process_dict_updates

        process_dict_updates(self.rows, batch_update, seeded_row)

    def apply(self, logits: torch.Tensor) -> torch.Tensor:
        if not self.rows:
            return logits
        batch = sorted(self.rows.items())
        for start in range(0, len(batch), ROWS_PER_CHUNK):
            self._draw_rows(logits, batch[start: start + ROWS_PER_CHUNK])
        return logits

    @staticmethod
    def _draw_rows(logits: torch.Tensor, batch: list[tuple[int, _Row]]) -> None:
        device = logits.device
        index = torch.tensor([i for i, _ in batch], device=device)
        # float64 temperatures: the learner divides by the Python float, not its float32 rounding
        temperatures = torch.tensor([r.temperature for _, r in batch], dtype=torch.float64, device=device)
        seeds, samples, positions = (torch.tensor(c, dtype=torch.long, device=device) for c in zip(
            *[(r.seed, r.sample, r.first_position + len(r.output_ids)) for _, r in batch], strict=True))
        tokens, logprobs = draw(logits[index], temperatures, seeds, samples_N=samples, positions_N=positions)
        logits[index] = float("-inf")
        logits[index, tokens] = logprobs.to(logits.dtype)


@cache
def processor_class() -> type:
    """`SeededRows` as the vLLM `LogitsProcessor` subclass `LLM(logits_processors=[...])` takes
    (vLLM checks the subclassing), built on first use so that importing this module needs no vLLM."""
    from vllm.v1.sample.logits_processor import LogitsProcessor

    class SeededLogitsProcessor(SeededRows, LogitsProcessor):
        pass

    return SeededLogitsProcessor
