"""Which version a group's tokens fit: its claimed one, or one just before it?

A worker that samples with an older version than it claims passes the per-group checks while the
versions are near: their log-probs differ by less than the tolerance, and the seeded sampler's
choice is the same under both at most positions. Where the two versions' choices differ, though,
the token tells them apart: an honest worker's is the claimed version's choice (an engine's
numerics flip only near-ties), a liar's the older one's. The learner already computes each
token's shortfall from the sampler's choice under the claimed version (learner.sampler_audit); the
same under each older version it holds gives, per offset, the positions where exactly one of
the two chose the token, and which one did. The coordinator weighs these counts as evidence that
accumulates per worker (policy.evidence)."""

from __future__ import annotations

import torch

from echo2.protocol.learner_api import VersionCheck


def version_checks(claimed_shortfalls: torch.Tensor, older_shortfalls: dict[int, torch.Tensor], *,
                   margin: float = 0.0) -> list[VersionCheck]:
    """Per offset (versions older than the claimed one), the tokens that are the claimed
    version's choice and fall short of the older one's by more than `margin`, and the reverse.
    A shortfall of 0 is the sampler's own choice under those weights (the learner recomputes
    the argmax, so its own choice is exact); `margin` (audit.version_margin) leaves out the
    near-ties an honest engine's numerics flip either way."""
    mine = claimed_shortfalls == 0
    out = []
    for offset, shortfalls in sorted(older_shortfalls.items()):
        if shortfalls.shape != claimed_shortfalls.shape:
            raise ValueError(f"shortfalls under the version {offset} older cover {tuple(shortfalls.shape)} tokens, "
                             f"under the claimed one {tuple(claimed_shortfalls.shape)}")
        theirs = shortfalls == 0
        out.append(VersionCheck(offset=offset, claimed=int((mine & (shortfalls > margin)).sum()),
                                older=int((theirs & (claimed_shortfalls > margin)).sum())))
    return out


def with_logprob_fits(checks: list[VersionCheck], claimed_diffs: torch.Tensor,
                      older_diffs: dict[int, torch.Tensor]) -> list[VersionCheck]:
    """The checks with, per offset, whether the group's behaviour log-probs fit the older
    version (their tokens' |differences| under the claimed version and under the older one):
    measured only where the claimed version's mean difference exceeds LOGPROB_FIT_FLOOR."""
    if claimed_diffs.numel() == 0:
        return checks
    claimed_by = float(claimed_diffs.mean())
    out = []
    for check in checks:
        diffs = older_diffs.get(check.offset)
        fit = None
        if claimed_by > LOGPROB_FIT_FLOOR and diffs is not None and diffs.numel() == claimed_diffs.numel():
            fit = float(diffs.mean()) < LOGPROB_FIT_RATIO * claimed_by
        out.append(check.model_copy(update={"logprob_fit": fit}))
    return out


def merge(checks: list[VersionCheck], more: list[VersionCheck]) -> list[VersionCheck]:
    """Counts of one group's segments (a generation that straddled versions) added per offset;
    a log-prob fit only where one segment measured it (each segment's is against its own
    version: together they are no one observation the evidence can weigh)."""
    totals: dict[int, VersionCheck] = {c.offset: c for c in checks}
    for c in more:
        before = totals.get(c.offset)
        totals[c.offset] = c if before is None else VersionCheck(
            offset=c.offset, claimed=before.claimed + c.claimed, older=before.older + c.older)
    return [totals[k] for k in sorted(totals)]


LOGPROB_FIT_RATIO = 0.5
"""A group's behaviour log-probs fit an older version when their mean |difference| from it is
below this share of their difference from the claimed version. An honest worker's differ from
the claimed version by its engine's numerics only (1e-5 nats per token in fp32, up to about
0.05 in bf16) and from an older version by about as much or more; a worker sampling with the
older version has it the other way round. The margin keeps near-identical versions (an engine's
numerics larger than the versions' gap) from holding honest groups out by chance."""


LOGPROB_FIT_FLOOR = 1e-3
"""Nats per token a group's behaviour log-probs must differ from the claimed version by before
their fit to an older one counts: below it (an fp32 engine's numerics, about 1e-5) the two
differences are both noise, and which is smaller says nothing; a lie whose versions differ by
less than this changes next to nothing the worker samples."""


def staler_versions(version: int, *, step: int, max_staleness: int, older_versions: int) -> list[int]:
    """The versions up to `older_versions` before `version` that would make a group staler than
    S at `step`."""
    older = (version - k for k in range(1, older_versions + 1))
    return [v for v in older if v >= 0 and step - v > max_staleness]


def may_be_staler(version: int, checks: list[VersionCheck], *, step: int, max_staleness: int) -> bool:
    """Whether a group's tokens fit, as well as its claim, an older version that would make it
    staler than S at `step`: at such an offset some token is the older version's choice and not
    the claimed one's, and no more are the claimed one's; or its log-probs fit that version
    (LOGPROB_FIT_RATIO: a group whose every token is also the claimed version's choice shows
    nothing in its tokens)."""
    return any((c.older > 0 and c.older >= c.claimed) or c.logprob_fit for c in checks
               if step - (version - c.offset) > max_staleness)


def fits(version: int, checks: list[VersionCheck]) -> int:
    """The version the group's tokens fit best: the claimed one unless an older one's choices
    outnumber it at the positions where they differ."""
    best = max(checks, key=lambda c: (c.older - c.claimed, -c.offset), default=None)
    return version - best.offset if best is not None and best.older > best.claimed else version
