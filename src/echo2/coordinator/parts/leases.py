"""Prompts handed out: the queue of prompts to lease again (expired, requeued or redone, oldest
work first), the cursor into the task's prompt stream, and the live leases. A lease's id
(`lease_id`) names it on every message, and names its group once submitted. Each lease has a
sampler seed (`seed_of`), keyed by a secret the store keeps, so no worker can choose or predict
it and a restarted coordinator derives the same one.

Every change is written through to the store (`pending`: prompts out or waiting) inside the
caller's transaction, so a restarted coordinator queues exactly the prompts that were out.
A worker's busy time (holding at least one lease) is measured here, on the coordinator's clock.
Each lease carries its own deadline (`policy.trust`: it follows the worker's measured
lease-to-submit time), past which the sweep requeues it."""

from __future__ import annotations

import hashlib
import hmac
import secrets
import uuid
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING

from echo2.coordinator.records.store import Store

if TYPE_CHECKING:  # its records are the registry's, shared: the lease book only keeps their busy time
    from echo2.coordinator.parts.registry import WorkerRecord


@dataclass
class Lease:
    lease_id: str
    """Names the lease on every message, and the group its submission becomes."""
    worker_id: str
    prompt_index: int
    version: int
    leased_at: float
    expires_at: float
    """When the sweep takes it back unanswered (leased_at + the worker's deadline)."""


class LeaseBook:
    def __init__(self, store: Store, workers: dict[str, WorkerRecord], clock: Callable[[], float]) -> None:
        """`workers`: the registry's records (shared): leases keep their busy time."""
        self.store, self.workers, self.clock = store, workers, clock
        self.leases: dict[str, Lease] = {}
        self.by_worker: dict[str, dict[str, Lease]] = {}
        """The live leases again, by worker: what one holds is a lookup, not a pass over all."""
        self.cursor: int = store.get_meta("cursor", 0)
        self.seed_key = bytes.fromhex(self._seed_key_hex(store))
        # prompts that were leased when we stopped go back to the queue: their leases died with us
        self.queue: deque[int] = deque(store.pending_prompts())
        with store.tx():
            for index in self.queue:
                store.set_pending(index, None)

    @staticmethod
    def _seed_key_hex(store: Store) -> str:
        key = store.get_meta("sampler_seed_key")
        if key is None:
            key = secrets.token_hex(32)
            store.set_meta("sampler_seed_key", key)
        return key

    def seed_of(self, lease_id: str) -> int:
        """The seeded sampler's 32-bit seed for this lease (models/sampler.py)."""
        digest = hmac.new(self.seed_key, lease_id.encode(), hashlib.sha256).digest()
        return int.from_bytes(digest[:4], "big")

    def held_by(self, worker_id: str) -> list[Lease]:
        return list(self.by_worker.get(worker_id, {}).values())

    def of(self, lease_id: str, worker_id: str) -> Lease | None:
        """The live lease `lease_id` when `worker_id` holds it."""
        lease = self.leases.get(lease_id)
        return lease if lease is not None and lease.worker_id == worker_id else None

    def held_by_new(self, is_new: Callable[[str], bool]) -> int:
        """Leases held by workers `is_new` says have no group accepted yet."""
        return sum(len(mine) for worker_id, mine in self.by_worker.items() if is_new(worker_id))

    def holders(self) -> set[str]:
        """Workers holding at least one lease."""
        return set(self.by_worker)

    def issue(self, record: WorkerRecord, version: int, count: int, deadline_s: float) -> list[Lease]:
        """`count` new leases for `record` at `version`, each answerable for `deadline_s`: queued
        prompts first, then new ones."""
        leases = []
        with self.store.tx():
            for _ in range(count):
                if self.queue:
                    index = self.queue.popleft()
                else:
                    index, self.cursor = self.cursor, self.cursor + 1
                now = self.clock()
                lease = Lease(f"L{uuid.uuid4().hex[:16]}", record.worker_id, index, version, now, now + deadline_s)
                self.leases[lease.lease_id] = lease
                self.by_worker.setdefault(record.worker_id, {})[lease.lease_id] = lease
                if record.leases_held == 0:
                    record.busy_since = lease.leased_at
                record.leases_held += 1
                self.store.set_pending(index, lease.lease_id)
                leases.append(lease)
            self.store.set_meta("cursor", self.cursor)
        return leases

    def requeue(self, leases: list[Lease]) -> None:
        """Leases that ended without a group (expired, their worker gone): their prompts go back
        to the head of the queue (call inside a transaction)."""
        for lease in leases:
            self._ended(lease)
            self.queue.appendleft(lease.prompt_index)  # oldest work first
            self.store.set_pending(lease.prompt_index, None)

    def close(self, lease: Lease) -> None:
        """A lease answered with a group (kept or dropped): its prompt is done (call inside a
        transaction)."""
        self._ended(lease)
        self.store.clear_pending(lease.prompt_index)

    def redo(self, prompt_indices: list[int]) -> None:
        """Prompts whose groups were thrown away go back to the head of the queue (inside the
        caller's transaction), so no prompt of the dataset is lost to a lying worker."""
        for index in prompt_indices:
            self.queue.appendleft(index)
            self.store.set_pending(index, None)

    def overdue(self, now: float) -> list[Lease]:
        return [lease for lease in self.leases.values() if now > lease.expires_at]

    def _ended(self, lease: Lease) -> None:
        del self.leases[lease.lease_id]
        mine = self.by_worker[lease.worker_id]
        del mine[lease.lease_id]
        if not mine:
            del self.by_worker[lease.worker_id]
        record = self.workers.get(lease.worker_id)
        if record is not None and record.leases_held > 0:
            record.leases_held -= 1
            if record.leases_held == 0:
                record.busy_s += self.clock() - record.busy_since
