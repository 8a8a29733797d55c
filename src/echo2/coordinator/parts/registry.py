"""Who works on the run: one record per worker id (alive or not, for the run's accounting),
the credential digests issued at registration, and the per-address join bucket that
rate-limits registrations and relay probes. Records of long-gone workers that did nothing and
cost nothing are forgotten, so a flood of registrations leaves bounded state."""

from __future__ import annotations

import random
import uuid
from collections.abc import Callable
from dataclasses import dataclass

from echo2.config.run import CoordinatorConfig
from echo2.coordinator.parts.credentials import credential_digest, new_worker_credential
from echo2.coordinator.parts.peers import LivePeers
from echo2.coordinator.parts.probe import check_relay_address
from echo2.coordinator.records.errors import RequestError
from echo2.protocol.messages import RegisterRequest

# ids the broadcast uses for itself: a worker registered as one could hijack the learner's place
RESERVED_WORKER_IDS = frozenset({"origin"})
JOIN_BUCKET_IDLE_S = 60.0
"""A bucket untouched this long is full again: nothing left to remember."""


@dataclass
class WorkerRecord:
    worker_id: str
    engine: str
    price_per_hour: float
    relay_address: str
    last_seen: float
    upload_bps: float = 1e9
    download_bps: float = 1e9
    version: int = -1
    held: int = -1
    """Newest version it holds in full (loaded or staged): what a delta it is sent must be against."""
    fetching: int = -1
    """Newest version it was told to fetch: what it will hold once the fetch is done (news to it
    assumes so; a worker whose fetch failed says what it holds in its next heartbeat)."""
    silent_after_s: float = 0.0
    """Silence past which it is taken for gone: the run's worker_timeout_s, stretched with the
    heartbeat interval it was last told."""
    alive: bool = True
    """False once evicted; the record stays for the run's accounting until it registers again."""
    rollouts: int = 0
    tokens: int = 0
    gen_time_s: float = 0.0
    credential_digest: str = ""
    """sha256 of the credential issued at registration (the credential itself is not kept)."""
    leases_held: int = 0
    busy_since: float = 0.0
    busy_s: float = 0.0
    """Time it held at least one lease, on the coordinator's clock: with `rollouts` (validated
    submissions) its measured throughput, which is what activation uses."""
    stale_since: float | None = None
    stale_s: float = 0.0
    """Time active, holding no lease, with weights too stale to be given any (waiting for a
    version its link has not brought yet): part of its working time for activation."""
    claimed_rollouts: int = 0
    claimed_busy_s: float = 0.0
    """What its heartbeats say (reported beside the measurement, never used to decide)."""
    claimed_bytes_relayed: int = 0
    claimed_dissemination_s: float | None = None
    sampler: str = "seeded"
    """How it says its engine draws tokens ("seeded" or "free", RegisterRequest.sampler)."""
    """Its heartbeats' weight bytes relayed to peers and last publish-to-loaded time (shown on
    the dashboard and /metrics; nothing is decided on them)."""

    def measured_busy_s(self, now: float) -> float:
        return self.busy_s + (now - self.busy_since if self.leases_held else 0.0)

    def measured_stale_s(self, now: float) -> float:
        return self.stale_s + (now - self.stale_since if self.stale_since is not None else 0.0)

    def work_counters(self, now: float) -> tuple[int, float, float]:
        """(validated rollouts, lease-holding s, too-stale s): what activation measures it by."""
        return self.rollouts, self.measured_busy_s(now), self.measured_stale_s(now)

    def mark_stale(self, stale: bool, now: float) -> None:
        """Open or close its too-stale spell."""
        if stale and self.stale_since is None:
            self.stale_since = now
        elif not stale and self.stale_since is not None:
            self.stale_s += now - self.stale_since
            self.stale_since = None


class Registry:
    def __init__(self, cfg: CoordinatorConfig, clock: Callable[[], float], quarantined: dict[str, str]) -> None:
        """`quarantined`: worker id -> reason, the audit's (shared, not copied): those ids are refused."""
        self.cfg, self.clock, self.quarantined = cfg, clock, quarantined
        self.workers: dict[str, WorkerRecord] = {}
        self.credentials: dict[str, str] = {}  # credential digest -> worker id
        self.join_buckets: dict[str, tuple[float, float]] = {}  # source address -> (tokens, as of)
        self.live_count = 0
        """Live workers: counted at every sweep, and each registration adds one meanwhile."""
        self.admitted = (cfg.registrations_per_s, clock())
        """The whole run's registration bucket: (tokens, as of)."""
        self.next_slot_at = 0.0
        """When the next refused registration is told to come back (each gets its own slot)."""
        self.membership = 0
        """Joins and departures so far: the live set changes only with it, and what the relay
        planner reads of a worker is fixed at registration, so a tree planned at one count
        holds until the next."""
        self._peers: LivePeers | None = None
        self._peers_at = 0.0

    def take_join_token(self, source: str) -> None:
        """Token bucket per source address: registrations_per_minute, with as large a burst (relay
        probes draw from it too: each makes the coordinator open a connection)."""
        rate, now = self.cfg.registrations_per_minute, self.clock()
        tokens, as_of = self.join_buckets.get(source, (rate, now))
        tokens = min(rate, tokens + (now - as_of) * rate / 60.0)
        if tokens < 1.0:
            wait_s = (1.0 - tokens) * 60.0 / rate
            raise RequestError(429, f"too many registrations from {source or 'this address'}: at most {rate:g} a "
                                    f"minute; retry in {wait_s:.1f} s")
        self.join_buckets[source] = (tokens - 1.0, now)

    def take_admission(self, refuse_for_s: float = 0.0) -> None:
        """The run's own registration pace, whatever address they come from: at most
        coordinator.registrations_per_s (as large a burst); a fleet joining at once is admitted
        at that pace instead of stalling the coordinator. Each refused worker is given its own
        slot to come back in (503, Retry-After): the slots follow each other at the admission
        pace, so a fleet that joined at once returns one by one, as fast as it can be admitted.
        `refuse_for_s`: the coordinator is overloaded and admits none now."""
        rate, now = self.cfg.registrations_per_s, self.clock()
        tokens, as_of = self.admitted
        tokens = min(rate, tokens + (now - as_of) * rate)
        if tokens < 1.0 or refuse_for_s > 0:
            slot_at = max(now + refuse_for_s + max(0.0, 1.0 - tokens) / rate, self.next_slot_at)
            self.next_slot_at = slot_at + 1.0 / rate
            wait_s = slot_at - now + random.uniform(0.0, 1.0 / rate)
            self.admitted = (tokens, now)
            raise RequestError(503, f"the coordinator admits {rate:g} registrations a second and is busy: retry in "
                                    f"{wait_s:.1f} s", retry_after_s=wait_s)
        self.admitted = (tokens - 1.0, now)

    def admit(self, req: RegisterRequest) -> tuple[WorkerRecord, str, WorkerRecord | None]:
        """A new record for `req` and its credential, plus the record it replaces (an evicted or
        departed worker joining again keeps its totals; its old credential is void). A live
        worker's id cannot be taken over."""
        worker_id = req.worker_id or f"w-{uuid.uuid4().hex[:8]}"
        self.refuse_quarantined(worker_id)
        if worker_id in RESERVED_WORKER_IDS:
            raise RequestError(422, f"worker_id {worker_id!r} is reserved; choose another")
        old = self.workers.get(worker_id)
        if old is not None and old.alive:
            raise RequestError(409, f"worker {worker_id!r} is live; a restarted worker may register again once the "
                                    f"coordinator has timed it out (worker_timeout_s={self.cfg.worker_timeout_s})")
        _check_relay_address(req.relay_address)
        if old is not None:
            self.credentials.pop(old.credential_digest, None)
        credential, digest = new_worker_credential()
        record = WorkerRecord(worker_id, req.engine, req.price_per_hour, req.relay_address, self.clock(),
                              upload_bps=req.upload_bps, download_bps=req.download_bps, credential_digest=digest,
                              sampler=req.sampler, silent_after_s=self.cfg.worker_timeout_s)
        if old is not None:
            record.rollouts, record.tokens, record.gen_time_s = old.rollouts, old.tokens, old.gen_time_s
        self.workers[worker_id] = record
        self.credentials[digest] = worker_id
        self.live_count += 1
        self.membership += 1
        return record, credential, old

    def depart(self, record: WorkerRecord) -> None:
        """`record`'s worker is gone (left, timed out or quarantined)."""
        record.alive = False
        self.membership += 1

    def worker_for_credential(self, credential: str) -> str | None:
        """The worker id a credential was issued to (None: not one this coordinator issued)."""
        return self.credentials.get(credential_digest(credential)) if credential else None

    def refuse_quarantined(self, worker_id: str) -> None:
        reason = self.quarantined.get(worker_id)
        if reason is not None:
            raise RequestError(403, f"worker {worker_id!r} is quarantined: {reason}")

    def live(self, worker_id: str) -> WorkerRecord:
        """The live record a request speaks for (refused when quarantined or unknown); the
        request itself is a sign of life."""
        self.refuse_quarantined(worker_id)
        record = self.workers.get(worker_id)
        if record is None or not record.alive:
            raise RequestError(404, f"unknown worker {worker_id!r}: register first (or again, after a timeout)")
        record.last_seen = self.clock()
        return record

    def excuse(self, stall_s: float) -> int:
        """The coordinator did not run for `stall_s`: no live worker counts that time as silence
        (its last sign of life moves forward by it, never past now). Returns how many."""
        now, excused = self.clock(), 0
        for record in self.workers.values():
            if record.alive:
                record.last_seen = min(now, record.last_seen + stall_s)
                excused += 1
        return excused

    def silent(self, now: float) -> list[str]:
        """Live workers silent past their timeout (worker_timeout_s, stretched with the heartbeat
        interval each was told), now marked gone; the live count is taken anew."""
        lost = [w for w in self.workers.values() if w.alive and now - w.last_seen > w.silent_after_s]
        for record in lost:
            self.depart(record)
        self.live_count = sum(1 for w in self.workers.values() if w.alive)
        return [w.worker_id for w in lost]

    def forget(self, now: float, horizon_s: float, costless: Callable[[str], bool]) -> list[str]:
        """Drop workers gone longer than `horizon_s` that never did any work and cost nothing,
        and idle join buckets. Returns the ids forgotten."""
        gone = [w for w in self.workers.values()
                if not w.alive and w.rollouts == 0 and now - w.last_seen > horizon_s and costless(w.worker_id)]
        for record in gone:
            del self.workers[record.worker_id]
            self.credentials.pop(record.credential_digest, None)
        for source in [s for s, (_, as_of) in self.join_buckets.items() if now - as_of > JOIN_BUCKET_IDLE_S]:
            del self.join_buckets[source]
        return [w.worker_id for w in gone]

    def peers(self, max_age_s: float = 0.0) -> LivePeers:
        """The live workers for the broadcast, made anew when older than `max_age_s` (replies
        to late joiners share one view a second; a version's plan takes a fresh one)."""
        now = self.clock()
        if self._peers is None or max_age_s <= 0 or now - self._peers_at > max_age_s:
            self._peers, self._peers_at = LivePeers((w for w in self.workers.values() if w.alive),
                                                    membership=self.membership), now
        return self._peers

    def peers_for_plan(self) -> LivePeers:
        """The live workers for a version's relay tree: the last view while no one has joined or
        left (a plan reads only what is fixed at registration, so a steady fleet of 10,000 costs
        a version no pass over it)."""
        if self._peers is None or self._peers.membership != self.membership:
            return self.peers()
        return self._peers

    def alive_versions(self) -> dict[str, int]:
        return {w.worker_id: w.version for w in self.workers.values() if w.alive}


def _check_relay_address(address: str) -> None:
    """A registration's relay address is what peers are sent to and what the console shows: a
    well-formed http(s)://HOST:PORT, or empty for a broadcast leaf."""
    problem = check_relay_address(address) if address else None
    if problem:
        raise RequestError(422, f"refused registration: relay_address: {problem}; fix: advertise the relay as "
                                "http://HOST:PORT (relay_advertise_host, relay_port), or send an empty "
                                "relay_address to join as a broadcast leaf (accepts_incoming=false)")
