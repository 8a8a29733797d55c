"""Semantic checks of a rollout submission beyond its schema: the right number of completions,
token ids inside the vocabulary, one finite non-positive log-prob per token, lengths within the
sampling budget. Returns the first problem found, phrased for the worker's operator."""

from __future__ import annotations

import math

from echo2.protocol.messages import RolloutSubmission, SamplingParams

# log-probs are <= 0; allow float round-off from the engine's softmax
_LOGPROB_SLACK = 1e-4
# no sampler draws a token it gives probability e^-50 (2e-22): over 10^12 sampled tokens that
# happens with probability 2e-10. A lower behaviour log-prob is fabricated (-100 once turned the
# learner's weights into NaN).
MIN_PLAUSIBLE_LOGPROB = -50.0


def check_submission(req: RolloutSubmission, sampling: SamplingParams, vocab_size: int) -> str | None:
    if len(req.completions) != sampling.group_size:
        return f"rollout.completions has {len(req.completions)} entries; the group size is {sampling.group_size}"
    for i, completion in enumerate(req.completions):
        problem = _check_completion(completion.token_ids, completion.logprobs, sampling, vocab_size)
        if problem:
            return f"rollout.completions[{i}]: {problem}"
    return None


def _check_completion(token_ids: list[int], logprobs: list[float], sampling: SamplingParams, vocab: int) -> str | None:
    if not 1 <= len(token_ids) <= sampling.max_new_tokens:
        return f"has {len(token_ids)} tokens; expected 1..{sampling.max_new_tokens}"
    if len(logprobs) != len(token_ids):
        return f"logprobs has {len(logprobs)} values for {len(token_ids)} tokens; expected one per token"
    bad_ids = [t for t in token_ids if not 0 <= t < vocab]
    if bad_ids:
        return f"token id {bad_ids[0]} outside the vocabulary [0, {vocab})"
    bad_lp = [x for x in logprobs if not math.isfinite(x) or not MIN_PLAUSIBLE_LOGPROB <= x <= _LOGPROB_SLACK]
    if bad_lp:
        return f"logprob {bad_lp[0]!r} is not a finite value in [{MIN_PLAUSIBLE_LOGPROB}, 0] (no sampler draws such a token)"
    return None
