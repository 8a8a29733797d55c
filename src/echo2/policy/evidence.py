"""Evidence that accumulates per worker: does it sample with an older version than it claims?

One group's check is too small to see a lie of a version or two (nearby versions agree on most
tokens, and their log-probs differ by less than the audit's tolerance), but the same small bias
in every group is strong evidence taken together. Each audited group brings, per offset k (1 to
audit.older_versions), two observations (learner.version_check):
- tokens: the positions where the claimed version's seeded choice and the choice of the version
  k older differ, and which of the two chose the token;
- log-probs: whether the group's behaviour log-probs fit the version k older better than the
  claimed one by the audit's margin (LOGPROB_FIT_RATIO), where they differ from the claimed
  one by more than an fp32 engine's numerics.

The test. An honest worker's token is the claimed version's choice at such a position with
probability at least p (audit.honest_match_rate), the older one's at most 1 - p; a worker
sampling with the version k older, the reverse: per token of the older choice the
log-likelihood ratio of "k older" against "honest" gains L = log(p / (1 - p)), per token of the
claimed one it loses L. An honest worker's group fits an older version's log-probs with
probability at most r (audit.honest_logprob_fit_rate), a liar's with LIAR_LOGPROB_FIT_RATE: a
fit gains log(q / r), a miss loses log((1 - r) / (1 - q)). Under the honest model each of these
2 x older_versions likelihood ratios is a nonnegative supermartingale (whatever the
observations' dependence on each other), and so is their average with fixed weights, so by
Ville's inequality the chance that the average ever reaches 1 / a is at most a
(audit.false_positive_rate): the worker is quarantined when it does, a sequential probability
ratio test with no fixed length. Each log-ratio is floored at -log(1 / a): a worker honest for
a long time banks no more than one bound's worth against a later lie, and a rise of WATCH_NATS
from a log-ratio's lowest point (a CUSUM's alarm) has every group of the worker checked again,
so a worker that turns to lying after clearing is not checked by chance alone."""

from __future__ import annotations

import math
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Literal

from echo2.protocol.learner_api import VersionCheck

LIAR_LOGPROB_FIT_RATE = 0.5
"""The test's model of a liar's log-probs: half its groups fit the older version it samples
with. A fit is then log(q / r) nats of evidence and a miss costs little; a liar whose groups fit
less often (bf16 numerics near the versions' gap) still drifts up while over about
log((1 - r) / (1 - q)) / log(q (1 - r) / (r (1 - q))) of them fit (15% at r = 0.01). Only the
test's power depends on it; its error rate holds for any liar."""

WATCH_NATS = math.log(20.0)
"""A rise of a log-ratio from its lowest point that has every group of the worker checked (not
by chance): two tokens of an older version's choice, or one group's log-probs fitting one. An
honest worker gets there by chance only (less than 1 in 20 from any low point, Ville again),
and it costs it forward passes, nothing more."""

Side = Literal["tokens", "logprobs"]


@dataclass
class VersionEvidence:
    older_versions: int
    """The offsets tested (audit.older_versions): the average's weights are fixed in advance."""
    honest_match_rate: float
    false_positive_rate: float
    honest_logprob_fit_rate: float = 0.01
    log_ratio: dict[str, dict[tuple[Side, int], float]] = field(default_factory=dict)
    """worker id -> (side, offset) -> log-likelihood ratio of "samples that much older" (nats)."""
    low: dict[str, dict[tuple[Side, int], float]] = field(default_factory=dict)
    """worker id -> (side, offset) -> the lowest that log-ratio has been (`watched`)."""

    @property
    def step_nats(self) -> float:
        """What one token at a position where the versions disagree moves a log-ratio."""
        p = self.honest_match_rate
        return math.log(p / (1.0 - p))

    @property
    def logprob_steps_nats(self) -> tuple[float, float]:
        """What a group whose log-probs fit an older version adds, and what one that does not
        takes away."""
        q, r = LIAR_LOGPROB_FIT_RATE, self.honest_logprob_fit_rate
        return math.log(q / r), math.log((1.0 - q) / (1.0 - r))

    @property
    def bound_nats(self) -> float:
        return math.log(1.0 / self.false_positive_rate)

    def _components(self) -> list[tuple[Side, int]]:
        return [(side, k) for side in ("tokens", "logprobs") for k in range(1, self.older_versions + 1)]

    def add(self, worker_id: str, checks: Iterable[VersionCheck]) -> float:
        """Take one group's checks; returns the worker's evidence after them (`nats`)."""
        mine = self.log_ratio.setdefault(worker_id, {})
        lows = self.low.setdefault(worker_id, {})
        fit, miss = self.logprob_steps_nats
        for check in checks:
            if not 1 <= check.offset <= self.older_versions:
                continue  # a learner configured otherwise: not an offset this test weighs
            moves: list[tuple[Side, float]] = [("tokens", self.step_nats * (check.older - check.claimed))]
            if check.logprob_fit is not None:
                moves.append(("logprobs", fit if check.logprob_fit else miss))
            for side, move in moves:
                key = (side, check.offset)
                mine[key] = max(-self.bound_nats, mine.get(key, 0.0) + move)
                lows[key] = min(lows.get(key, 0.0), mine[key])
        return self.nats(worker_id)

    def nats(self, worker_id: str) -> float:
        """log of the components' average likelihood ratio: 0 knows nothing, above 0 leans to a
        lie, `bound_nats` is the verdict."""
        if self.older_versions <= 0:
            return 0.0
        mine = self.log_ratio.get(worker_id, {})
        values = [mine.get(key, 0.0) for key in self._components()]
        top = max(values)
        return top + math.log(sum(math.exp(v - top) for v in values) / len(values))

    def leans(self, worker_id: str) -> bool:
        """Some component's evidence says "older" more than "honest": its groups are held out
        until the evidence settles (a lie of that many versions is not averaged away by the
        others)."""
        return any(value > 0 for value in self.log_ratio.get(worker_id, {}).values())

    def watched(self, worker_id: str) -> bool:
        """Some component has risen WATCH_NATS or more from its lowest point: every group of the
        worker is checked until it falls back."""
        lows = self.low.get(worker_id, {})
        return any(value - lows.get(key, 0.0) >= WATCH_NATS for key, value in self.log_ratio.get(worker_id, {}).items())

    def cleared(self, worker_id: str) -> bool:
        """Every offset's token evidence has reached the floor, -log(1 / a), and nothing is
        watched: the test's other verdict, that the worker does not sample that much older (an
        honest worker gets there within a few groups wherever versions disagree; a liar never
        does at the offset of its lie). The log-prob side says nothing of an fp32 engine, whose
        groups differ from the claimed version by less than LOGPROB_FIT_FLOOR: it need not clear."""
        mine = self.log_ratio.get(worker_id, {})
        return (self.older_versions > 0 and not self.watched(worker_id)
                and all(mine.get(("tokens", k), 0.0) <= -self.bound_nats for k in range(1, self.older_versions + 1)))

    def lied(self, worker_id: str) -> bool:
        return self.nats(worker_id) >= self.bound_nats

    def likeliest(self, worker_id: str) -> tuple[Side, int] | None:
        """Which evidence, and how many versions older than it claims, the worker's groups fit
        best (None: none fits better than its claim)."""
        mine = self.log_ratio.get(worker_id, {})
        best = max(mine.items(), key=lambda item: (item[1], -item[0][1]), default=None)
        return best[0] if best is not None and best[1] > 0 else None

    def likeliest_offset(self, worker_id: str) -> int | None:
        best = self.likeliest(worker_id)
        return best[1] if best is not None else None
