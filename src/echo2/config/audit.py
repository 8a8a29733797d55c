"""The rollout audit (`[audit]`): the learner checks that workers' tokens were sampled from the
version they claim, and the coordinator quarantines workers that fail it."""

from __future__ import annotations

from pydantic import Field

from echo2.config.base import Frozen


class AuditConfig(Frozen):
    enabled: bool = True
    """Compare trained groups' behaviour log-probs with the log-probs of the weights their
    worker was sent; off: trust workers' log-probs as they come (only for fleets you control)."""
    max_mean_abs_logprob_diff: float = Field(0.15, gt=0)
    """A group fails the audit when its tokens' mean |log-prob under the version its worker was
    sent - behaviour log-prob| exceeds this (nats). An honest engine differs by its numerics
    only: about 1e-5 computing in fp32, up to about 0.05 computing in bf16 (as GPU engines do;
    benchmarks/audit_honest_diff.py). The default is 3x that, so no honest bf16 worker is
    flagged; fabricated log-probs or tokens from another model land far above (tens of nats
    is typical). Tighten it on a uniform fleet: the summary reports the largest honest
    difference seen per worker."""
    recompute_fraction: float = Field(0.5, ge=0.0, le=1.0)
    """Share of the groups the learner cannot check for free that it recomputes under the
    version their worker received (the published payload: wire dtype, bf16 rounding included):
    groups of older versions, and with a wire dtype other than the learner's own (bf16 wire,
    fp32 masters) the current version's too. Groups at the current version with a wire equal
    to the learner's weights are always checked, at no extra cost. Which groups is decided by a
    keyed hash workers cannot predict. Each one costs a forward pass."""
    cached_versions: int | None = Field(None, ge=0)
    """Recent versions the learner keeps to recompute stale groups: their published payloads
    (CPU, wire dtype), shared with the origin, so only versions beyond broadcast.keep_versions
    cost memory. None: train.max_staleness + 1 + older_versions, the current version, every
    admissible older one and the versions before those that groups are compared with. Fewer
    leaves the oldest admissible groups unaudited (with S = 2 in the demo, most trained groups
    are two versions old)."""
    older_versions: int = Field(3, ge=0, le=16)
    """Versions just before the claimed one that a sampler-checked group's tokens are also
    compared with (learner.version_check): where a version's choice differs from the claimed
    one's, an honest worker's token is the claimed version's choice and a worker sampling with
    an older version than it claims picks the older one's. Each costs a forward pass per checked
    group, and the learner keeps that many more versions (`cached_versions`). 0: no comparison."""
    version_margin: float = Field(0.5, ge=0.0)
    """How far (perturbed-score units, as sampler_margin) the other version's choice must be
    ahead of a token for it to count in the version test: where the claimed and an older
    version's choices are nearly tied, an engine computing in bf16 picks either (its tokens fall
    short of the claimed version's choice by up to about half a unit, benchmarks/sampler_audit.py),
    so such positions tell its numerics from a lie no better than a coin
    (benchmarks/audit_honest_diff.py measures the honest match rate with and without it)."""
    honest_match_rate: float = Field(0.9, gt=0.5, lt=1.0)
    """The share of an honest worker's tokens, at positions where the claimed version's choice and
    an older one's differ, that are the claimed version's: the test's model of an honest worker
    (policy.evidence). An fp32 engine picks the claimed choice at all of them; lower it for
    engines whose numerics flip more near-ties (tests/unit/test_version_check.py shows the HF
    engine's). A worker whose tokens match less often than this can be quarantined although
    honest."""
    honest_logprob_fit_rate: float = Field(0.01, gt=0.0, lt=0.5)
    """The most often an honest worker's group fits an older version's log-probs better than the
    claimed one's (learner.version_check.LOGPROB_FIT_RATIO): the test's model of an honest
    engine's log-probs (policy.evidence); benchmarks/audit_sequential.py measures it per wire
    dtype (docs/security.md). Each group that fits is log(0.5 / this)
    nats of evidence, each that does not takes back log(0.99 / 0.5) at the default."""
    false_positive_rate: float = Field(1e-3, gt=0.0, lt=0.5)
    """The chance that the version test quarantines an honest worker (one matching at
    honest_match_rate or more): a worker is quarantined when the likelihood ratio of its tokens
    under "it samples an older version" against "it samples the claimed one" reaches 1 / this."""
    proven_groups: int = Field(32, ge=0, le=100_000)
    """A worker is unproven until its version evidence clears it (every offset's evidence at the
    honest bound, policy.evidence) or this many of its groups have been audited: until then every
    group of it is checked, whatever recompute_fraction says, so each is held out where its own
    tokens fit a version staler than S (learner.version_check). 0: new workers are checked by
    chance like any other. While a worker's version evidence leans against it, its groups are
    checked and held out of training."""
    require_seeded_sampler: bool = True
    """Workers must draw tokens with the seeded sampler (echo2's engines, hf and vllm, do):
    then the audit checks that every token of a recomputed group is the one the lease's seed
    picks, which catches a worker that chooses its tokens and reports their true log-probs.
    Off: free-sampling workers may join, and their groups are checked by log-probs only."""
    sampler_margin: float = Field(1.0, gt=0)
    """How far (in perturbed-score units: logits / T plus Gumbel noise) a token may fall short of
    the seeded sampler's choice and still count as its choice: an honest engine differs from the
    learner's logits only by numerics, so only near-ties fall short, by about those numerics:
    nothing in fp32, about half a unit at most computing in bf16 (benchmarks/sampler_audit.py).
    A token chosen by the worker instead falls short by the Gumbel gap, which 1.0 catches in
    every greedy group."""
    max_sampler_violations: int = Field(0, ge=0)
    """Tokens of a recomputed group allowed to fall short by more than sampler_margin before the
    group fails the audit."""
    flags_to_quarantine: int = Field(2, ge=1)
    """Failed groups after which the coordinator quarantines a worker: its buffered groups are
    dropped, its leases and submissions refused, and its id can never register again. A failed
    group is never trained: the step that found it is redone without it."""
    uninformative_fraction: float = Field(0.1, ge=0.0, le=1.0)
    """Share of the groups grpo.drop_uninformative_groups would drop that go to the learner
    anyway, weightless, so the audit checks them (chosen by a stream workers cannot predict);
    every one goes while the worker has fewer than 4 audited groups. A worker whose groups all
    score alike (one that returns its greedy choice G times) is audited like any other. Each
    costs its forward and backward pass and a batch slot."""
