"""Which policy version sampled each token of a completion, on the wire as runs.

A worker that swaps in a new version while a generation is in flight (`sampling.segment_tokens`)
samples the first tokens of a completion with one version and the rest with later ones. Each
completion then carries `token_versions`: runs of (version, tokens), in token order, versions
increasing, covering every token. Empty: every token is the submission's `version`, which is
what a generation that never straddles a version sends (and what protocol 6 meant).

Runs keep the message small (a 16k-token completion that straddles three versions is three
pairs) and make the claim easy to bound: at most one run per version the worker could have held.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence

Runs = Sequence[Sequence[int]]
"""[(version, tokens), ...] as it travels (JSON arrays of two integers)."""


def encode(versions: Sequence[int]) -> list[tuple[int, int]]:
    """The runs of a per-token version list; [] when every token has the same version (the
    submission's version says it then)."""
    runs: list[tuple[int, int]] = []
    for version in versions:
        if runs and runs[-1][0] == version:
            runs[-1] = (version, runs[-1][1] + 1)
        else:
            runs.append((version, 1))
    return runs if len(runs) > 1 else []


def expand(runs: Runs, tokens: int, version: int) -> list[int]:
    """Each token's version: the runs spelled out, or `version` for every token when there are
    none. Call `problem` first on anything a worker sent."""
    if not runs:
        return [version] * tokens
    return [v for v, n in runs for _ in range(n)]


def problem(runs: Runs, *, tokens: int, version: int, newest: int, field: str) -> str | None:
    """Why these runs cannot be what a worker sampled (None: they can). `version`: the
    submission's, the version the generation started with (the first run's); `newest`: the
    newest version published, which no token can be newer than."""
    if not runs:
        return None
    if len(runs) < 2:
        return f"{field} has one run; send [] when every token is version {version}"
    previous = None
    for index, (v, n) in enumerate(runs):
        if n < 1:
            return f"{field}[{index}] covers {n} tokens; every run covers at least one"
        if previous is not None and v <= previous:
            return f"{field}[{index}] is version {v} after version {previous}; versions must increase"
        previous = v
    if runs[0][0] != version:
        return f"{field} starts at version {runs[0][0]}; the generation started at rollout.version={version}"
    if previous is not None and previous > newest:
        return f"{field} claims version {previous}; the newest published is {newest}"
    covered = sum(n for _, n in runs)
    if covered != tokens:
        return f"{field} covers {covered} tokens; the completion has {tokens}"
    return None


def tokens_by_version(completions: Sequence, version: int, *, trained_only: bool = True) -> dict[int, int]:
    """How many of a group's tokens each version sampled (the model's tokens only: an
    environment's answers in a multi-turn transcript are context, never trained), for the
    staleness bound per token (`policy.admission.admits_tokens`). Always holds `version`."""
    counts: Counter[int] = Counter({version: 0})
    for completion in completions:
        per_token = expand(completion.token_versions, len(completion.token_ids), version)
        for v, model_token in zip(per_token, completion.model_token_mask(), strict=True):
            if model_token or not trained_only:
                counts[v] += 1
    return dict(counts)

