"""Evidence that accumulates per worker: does it sample with an older version than it claims?

One group's check is too small to see a lie of a version or two (nearby versions agree on most
tokens, and their log-probs differ by less than the audit's tolerance), but the same small bias
in every group is strong evidence taken together. Each audited group brings, per offset k (1 to
audit.older_versions), the positions where the claimed version's seeded choice and the choice of
the version k older differ, and which of the two chose the token (learner.version_check).

The test. An honest worker's token is the claimed version's choice at such a position with
probability at least p (audit.honest_match_rate), the older one's at most 1 - p; a worker
sampling with the version k older, the reverse. Per offset, the log-likelihood ratio of "k
older" against "honest" gains L = log(p / (1 - p)) per token of the older choice and loses L per
token of the claimed one. Under the honest model the likelihood ratio is a nonnegative
supermartingale, and so is its average over the offsets (each weighted 1 / older_versions), so
by Ville's inequality the chance that the average ever reaches 1 / a is at most a
(audit.false_positive_rate): the worker is quarantined when it does, a sequential probability
ratio test with no fixed length. Each offset's log-ratio is floored at -log(1 / a): a worker
honest for a long time banks no more than one bound's worth against a later lie, so a lie that
starts late still needs about twice the evidence of one from the start, and an honest worker
at the floor reaches the bound with chance at most a^2 per excursion."""

from __future__ import annotations

import math
from collections.abc import Iterable
from dataclasses import dataclass, field

from echo2.protocol.learner_api import VersionCheck


@dataclass
class VersionEvidence:
    older_versions: int
    """The offsets tested (audit.older_versions): the average's weights are fixed in advance."""
    honest_match_rate: float
    false_positive_rate: float
    log_ratio: dict[str, dict[int, float]] = field(default_factory=dict)
    """worker id -> offset -> log-likelihood ratio of "samples that much older" (nats)."""

    @property
    def step_nats(self) -> float:
        """What one token at a position where the versions disagree moves a log-ratio."""
        p = self.honest_match_rate
        return math.log(p / (1.0 - p))

    @property
    def bound_nats(self) -> float:
        return math.log(1.0 / self.false_positive_rate)

    def add(self, worker_id: str, checks: Iterable[VersionCheck]) -> float:
        """Take one group's checks; returns the worker's evidence after them (`nats`)."""
        mine = self.log_ratio.setdefault(worker_id, {})
        for check in checks:
            if not 1 <= check.offset <= self.older_versions:
                continue  # a learner configured otherwise: not an offset this test weighs
            moved = mine.get(check.offset, 0.0) + self.step_nats * (check.older - check.claimed)
            mine[check.offset] = max(-self.bound_nats, moved)
        return self.nats(worker_id)

    def nats(self, worker_id: str) -> float:
        """log of the offsets' average likelihood ratio: 0 knows nothing, above 0 leans to a lie,
        `bound_nats` is the verdict."""
        if self.older_versions <= 0:
            return 0.0
        mine = self.log_ratio.get(worker_id, {})
        values = [mine.get(k, 0.0) for k in range(1, self.older_versions + 1)]
        top = max(values)
        return top + math.log(sum(math.exp(v - top) for v in values) / len(values))

    def leans(self, worker_id: str) -> bool:
        """Some offset's evidence says "older" more than "honest": its groups are held out until
        the evidence settles (a lie of that many versions is not averaged away by the others)."""
        return any(value > 0 for value in self.log_ratio.get(worker_id, {}).values())

    def cleared(self, worker_id: str) -> bool:
        """Every offset's evidence has reached the floor, -log(1 / a): the test's other verdict,
        that the worker does not sample that much older (an honest worker gets there within a
        few groups wherever versions disagree; a liar never does at the offset of its lie)."""
        mine = self.log_ratio.get(worker_id, {})
        return self.older_versions > 0 and all(mine.get(k, 0.0) <= -self.bound_nats
                                               for k in range(1, self.older_versions + 1))

    def lied(self, worker_id: str) -> bool:
        return self.nats(worker_id) >= self.bound_nats

    def likeliest_offset(self, worker_id: str) -> int | None:
        """How many versions older than it claims the worker's tokens fit best (None: none fits
        better than its claim)."""
        mine = self.log_ratio.get(worker_id, {})
        best = max(mine.items(), key=lambda item: (item[1], -item[0]), default=None)
        return best[0] if best is not None and best[1] > 0 else None
