"""The rollout audit (`[audit]`): the learner checks that workers' tokens were sampled from the
version they claim, and the coordinator quarantines workers that fail it."""

from __future__ import annotations

from pydantic import Field

from echo2.config.base import Frozen


class AuditConfig(Frozen):
    enabled: bool = True
    """Compare trained groups' behaviour log-probs with the log-probs of the weights their
    worker was sent; off: trust workers' log-probs as they come (only for fleets you control)."""
    max_mean_abs_logprob_diff: float = Field(0.1, gt=0)
    """A group fails the audit when its tokens' mean |learner log-prob - behaviour log-prob|
    exceeds this (nats). Honest mismatch measured here: at most 3.0e-6 with fp32 HF workers (0 of 784 honest groups failed in benchmarks/chaos.py) and 2e-7
    with vLLM on CPU; bf16 GPU engines run larger (around 1e-2). Fabricated log-probs or tokens
    from another model land far above (tens of nats is typical). Tighten it on a uniform fleet:
    the summary reports the largest honest difference seen per worker."""
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
    cost memory. None: train.max_staleness + 1, the current version and every admissible older
    one. Fewer leaves the oldest admissible groups unaudited (with S = 2 in the demo, most
    trained groups are two versions old)."""
    flags_to_quarantine: int = Field(2, ge=1)
    """Failed groups after which the coordinator quarantines a worker: its buffered groups are
    dropped, its leases and submissions refused, and its id can never register again. A failed
    group is never trained: the step that found it is redone without it."""
