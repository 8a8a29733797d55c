"""Bad-peer reports, and the coordinator's own checks of them. A report is a claim by an
untrusted worker, so it weighs only this much:
- a report counts only when the coordinator gave the reporter that peer as a source for that
  version (`Dissemination.report` checks), and only for `broadcast.report_lifetime_versions`
  versions from the one it was made for; a counted report keeps the reporter away from the peer;
- from a reporter with standing (`policy.trust.REPORT_STANDING_GROUPS` accepted groups) that no
  check has refuted, it asks for a check: the coordinator fetches the chunk the report names
  from the peer itself (`broadcast.chunk_check`, run by `http/relay_checks.py`);
- a check that gets bad bytes drops the peer as a source for everyone, for the report's
  lifetime; one that gets the genuine chunk refutes every report of it, and those reporters'
  reports never ask for a check again; a peer that cannot be asked confirms nothing.
Checks are bounded (MAX_PENDING_CHECKS, one per peer, version, form and chunk), and a verdict is
kept as long as reports of its version count, so reports repeated cost nothing."""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass, field
from typing import Literal

from echo2.config.broadcast import BroadcastConfig
from echo2.protocol.manifest import Manifest

MAX_PENDING_CHECKS = 32
"""Checks waiting or in flight; reports beyond them keep only their reporter away (a burst of
reports cannot queue unbounded work on the coordinator)."""

ReportEffect = Literal["none", "reporter", "check", "everyone", "refuted"]
"""What a report did: nothing (it does not count), kept its reporter away, asked for a check,
met a peer a check already caught, or met a chunk a check already found genuine (held against
the reporter)."""
CheckVerdict = Literal["good", "bad", "unreachable"]
CheckKey = tuple[str, int, str, int]
"""(peer id, version, form, chunk index)."""


@dataclass
class RelayCheck:
    """One chunk of one peer to fetch and judge, and the reporters waiting on the verdict."""

    key: CheckKey
    manifest: Manifest
    reporters: set[str] = field(default_factory=set)

    @property
    def peer_id(self) -> str:
        return self.key[0]

    @property
    def chunk_index(self) -> int:
        return self.key[3]


class RelayReports:
    def __init__(self, config: BroadcastConfig) -> None:
        self.config = config
        self.newest = -1
        self.reporters: dict[str, dict[str, int]] = {}
        """peer id -> each worker whose report of it counts -> the newest version reported."""
        self.caught: dict[str, int] = {}
        """peer id -> the newest version a check got bad bytes of: no one is sent to it."""
        self.refuted: dict[str, int] = {}
        """reporter id -> its reports a check found false: its reports ask for no check again."""
        self.checks: dict[CheckKey, RelayCheck] = {}
        """Waiting or in flight."""
        self._queue: deque[CheckKey] = deque()
        self.verdicts: dict[CheckKey, CheckVerdict] = {}

    def report(self, peer_id: str, reporter_id: str, version: int, *, standing: bool, form: str, chunk_index: int,
               manifest: Manifest | None) -> ReportEffect:
        """A counted report (the reporter was sent to the peer for `version`); `manifest`: the
        version's in `form`, None when the coordinator no longer serves it (nothing to check
        against)."""
        mine = self.reporters.setdefault(peer_id, {})
        mine[reporter_id] = max(version, mine.get(reporter_id, version))
        if self.suspected(peer_id):
            return "everyone"
        if not standing or reporter_id in self.refuted or manifest is None:
            return "reporter"
        key = (peer_id, version, form, chunk_index)
        verdict = self.verdicts.get(key)
        if verdict == "good":
            self.refuted[reporter_id] = self.refuted.get(reporter_id, 0) + 1
            return "refuted"
        if verdict is not None:  # unreachable: asking again would tell no more
            return "reporter"
        check = self.checks.get(key)
        if check is None:
            if len(self.checks) >= MAX_PENDING_CHECKS:
                return "reporter"
            check = self.checks[key] = RelayCheck(key, manifest)
            self._queue.append(key)
        check.reporters.add(reporter_id)
        return "check"

    def next_check(self) -> RelayCheck | None:
        """The next check to run (it stays pending until `checked`)."""
        while self._queue:
            check = self.checks.get(self._queue.popleft())
            if check is not None:
                return check
        return None

    def checked(self, check: RelayCheck, verdict: CheckVerdict) -> list[str]:
        """Apply a check's verdict; returns the reporters it refuted."""
        self.checks.pop(check.key, None)
        peer_id, version = check.key[0], check.key[1]
        if not self.live(version):
            return []
        self.verdicts[check.key] = verdict
        if verdict == "bad":
            self.caught[peer_id] = max(version, self.caught.get(peer_id, version))
            return []
        if verdict == "unreachable":
            return []
        for reporter_id in check.reporters:
            self.refuted[reporter_id] = self.refuted.get(reporter_id, 0) + 1
        return sorted(check.reporters)

    def suspected(self, peer_id: str) -> bool:
        """A check caught `peer_id` sending bad bytes of a version whose reports still count."""
        version = self.caught.get(peer_id)
        return version is not None and self.live(version)

    def avoided(self, peer_id: str, for_worker: str) -> bool:
        """Whether `for_worker` is not sent to `peer_id`: caught, or reported by the worker itself."""
        mine = self.reporters.get(peer_id, {}).get(for_worker)
        return self.suspected(peer_id) or (mine is not None and self.live(mine))

    @property
    def suspects(self) -> set[str]:
        return {peer_id for peer_id in self.caught if self.suspected(peer_id)}

    def __bool__(self) -> bool:
        """Whether any report or check result is held (none: nobody is avoided)."""
        return bool(self.reporters or self.caught)

    def forget(self, worker_id: str) -> None:
        """A worker gone for good: its reports and the reports against it go; what a check found
        stays (a caught id that registers again is still caught)."""
        self.reporters.pop(worker_id, None)
        for reporters in self.reporters.values():
            reporters.pop(worker_id, None)

    def advance(self, version: int) -> None:
        """A new newest version: the reports, verdicts and checks that no longer count go."""
        self.newest = max(self.newest, version)
        for reporters in self.reporters.values():
            for reporter_id in [r for r, v in reporters.items() if not self.live(v)]:
                del reporters[reporter_id]
        self.reporters = {peer_id: reporters for peer_id, reporters in self.reporters.items() if reporters}
        self.caught = {peer_id: v for peer_id, v in self.caught.items() if self.live(v)}
        self.verdicts = {key: v for key, v in self.verdicts.items() if self.live(key[1])}
        self.checks = {key: c for key, c in self.checks.items() if self.live(key[1])}

    def live(self, version: int) -> bool:
        """Reports of `version` still count (report_lifetime_versions from the newest)."""
        return version > self.newest - self.config.report_lifetime_versions
