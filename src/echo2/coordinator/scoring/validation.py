"""Semantic checks of a rollout submission beyond its schema: the right number of completions,
token ids inside the vocabulary, one finite non-positive log-prob per token, lengths within the
sampling budget, versions per token that a worker could have sampled with (runs of increasing
versions from the generation's own, none unpublished), and for multi-turn episodes well-formed
segments (the replay then checks what they contain). Returns the first problem found, phrased
for the worker's operator."""

from __future__ import annotations

import math

from echo2.protocol import token_versions
from echo2.protocol.messages import RolloutCompletion, RolloutSubmission, SamplingParams

# log-probs are <= 0; allow float round-off from the engine's softmax
_LOGPROB_SLACK = 1e-4
# no sampler draws a token it gives probability e^-50 (2e-22): over 10^12 sampled tokens that
# happens with probability 2e-10. A lower behaviour log-prob is fabricated (and one of -100 would
# turn the learner's weights into NaN).
MIN_PLAUSIBLE_LOGPROB = -50.0


def check_submission(req: RolloutSubmission, sampling: SamplingParams, vocab_size: int,
                     max_episode_tokens: int | None = None, *, newest_version: int | None = None,
                     tool_answers: bool = False) -> str | None:
    """`max_episode_tokens`: the task is multi-turn and its transcripts have at most this many
    tokens (None: single-turn, one completion of at most sampling.max_new_tokens).
    `newest_version`: the newest version published, which no token's version may exceed (None:
    the submission's own). `tool_answers`: the task's replay takes the worker's tool answers
    (a worker-trusted environment); elsewhere a completion carrying any is refused."""
    if len(req.completions) != sampling.group_size:
        return f"rollout.completions has {len(req.completions)} entries; the group size is {sampling.group_size}"
    for i, completion in enumerate(req.completions):
        if max_episode_tokens is None:
            problem = _check_single(completion, sampling)
        else:
            problem = _check_episode(completion, sampling, max_episode_tokens)
        problem = problem or _check_tokens(completion.token_ids, completion.logprobs, vocab_size)
        if completion.tool_answers and not tool_answers:
            problem = problem or ("carries tool_answers, but this run's task replays its tools itself (task.trust is "
                                  "not 'worker-trusted'): send none")
        problem = problem or token_versions.problem(
            completion.token_versions, tokens=len(completion.token_ids), version=req.version,
            newest=req.version if newest_version is None else newest_version, field="token_versions")
        if problem:
            return f"rollout.completions[{i}]: {problem}"
    return None


def _check_single(completion: RolloutCompletion, sampling: SamplingParams) -> str | None:
    if completion.segments:
        return "has segments, but this run's task is single-turn (send none)"
    if not 1 <= len(completion.token_ids) <= sampling.max_new_tokens:
        return f"has {len(completion.token_ids)} tokens; expected 1..{sampling.max_new_tokens}"
    return None


def _check_episode(completion: RolloutCompletion, sampling: SamplingParams, max_tokens: int) -> str | None:
    segments, n = completion.segments, len(completion.token_ids)
    if not 1 <= n <= max_tokens:
        return f"has {n} tokens; an episode's transcript has 1..{max_tokens} (task.max_episode_tokens)"
    if not segments or len(segments) % 2 == 0 or min(segments) < 1 or sum(segments) != n:
        return (f"segments {segments[:6]}{'...' if len(segments) > 6 else ''}: expected an odd number of positive "
                f"lengths (action, answer, ..., action) summing to the {n} tokens")
    if max(segments[0::2]) > sampling.max_new_tokens:
        return f"an action of {max(segments[0::2])} tokens; at most {sampling.max_new_tokens} (sampling.max_new_tokens)"
    if len(completion.logprobs) == n and any(lp != 0.0 for lp in _environment_values(completion)):
        return "environment tokens carry log-probs; they must be 0 (the environment's tokens are not sampled)"
    return None


def _environment_values(completion: RolloutCompletion) -> list[float]:
    out, start = [], 0
    for index, length in enumerate(completion.segments):
        if index % 2:
            out += completion.logprobs[start:start + length]
        start += length
    return out


def _check_tokens(token_ids: list[int], logprobs: list[float], vocab: int) -> str | None:
    if len(logprobs) != len(token_ids):
        return f"logprobs has {len(logprobs)} values for {len(token_ids)} tokens; expected one per token"
    bad_ids = [t for t in token_ids if not 0 <= t < vocab]
    if bad_ids:
        return f"token id {bad_ids[0]} outside the vocabulary [0, {vocab})"
    bad_lp = [x for x in logprobs if not math.isfinite(x) or not MIN_PLAUSIBLE_LOGPROB <= x <= _LOGPROB_SLACK]
    if bad_lp:
        return (f"logprob {bad_lp[0]!r} is not a finite value in [{MIN_PLAUSIBLE_LOGPROB}, 0] (no sampler draws "
                "such a token)")
    return None
