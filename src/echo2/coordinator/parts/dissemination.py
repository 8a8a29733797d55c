"""The coordinator's side of the weight broadcast: for each published version, a relay tree over
the live workers (echo2.broadcast.topology) built from what they declared (link speeds, whether
they accept connections); late joiners get the fastest holders of the version. With delta
versions (broadcast.deltas) it also keeps the forms the learner's origin still serves (in the
store too, across a coordinator restart) and gives each worker the next fetch on the
fewest-bytes way from the version it holds to the newest (echo2.broadcast.catchup), asking the
learner for an anchor when that way is too long.

Bad-peer reports come from untrusted workers, so one counts only when the coordinator gave the
reported peer to the reporter as a source for that version (a bounded record of what each
worker was given); what a counted report does, and the coordinator's check that must confirm it
before a peer is dropped for everyone, is `parts.relay_reports`. The learner's origin is never
dropped."""

from __future__ import annotations

from collections.abc import Iterable
from itertools import islice

from echo2.broadcast.catchup import ServedForm, cheapest_path, path_bytes, retained
from echo2.broadcast.topology import late_joiner_assignment, plan_broadcast
from echo2.config.broadcast import BroadcastConfig
from echo2.coordinator.parts.news_order import tree_order
from echo2.coordinator.parts.peers import LivePeers, PeerLike, fleet_key, live_peers
from echo2.coordinator.parts.relay_reports import RelayReports, ReportEffect
from echo2.planner.dissemination import bytes_per_s
from echo2.protocol.broadcast import ORIGIN_ID, Assignment, BroadcastPlan, OriginInfo, PeerInfo, Source
from echo2.protocol.manifest import Form, Manifest
from echo2.protocol.messages import VersionInfo


class Dissemination:
    def __init__(self, config: BroadcastConfig, learner_upload_bps: float) -> None:
        self.config = config
        self.learner_upload_bps = learner_upload_bps
        self.plan: BroadcastPlan | None = None
        self.newest = -1
        """The newest version planned or published: what reports and assignments expire against."""
        self.reports = RelayReports(config)
        self.assigned: dict[int, dict[str, tuple[str, ...]]] = {}
        """version -> worker id -> the peer ids it was given as sources: whom it can report (by
        version first, so a version that stops counting goes in one step)."""
        self.offers: dict[tuple[int, Form], tuple[VersionInfo, ServedForm]] = {}
        """The forms the learner's origin serves (the same rule as its relay: catchup.retained)."""
        self.full_bytes = 0
        """Bytes of the newest version in full: what catching up is weighed against."""
        self.tree_form: Form = "full"
        """The form the newest version's relay tree carries."""
        self.anchor_wanted = False
        """A live worker's way to the newest version costs more than anchor_when_behind full
        versions (or there is none): the next publish reply asks the learner for an anchor."""
        self._planned_from: tuple[tuple, BroadcastPlan] | None = None
        """The last plan made in full, with what it was made from."""
        self._in_plan: dict[str, Assignment] = {}
        """The newest plan's assignments made for its version, by worker (`_placed`)."""
        self._late: dict[tuple[str, int], Assignment] = {}
        """Sources given to workers outside the newest plan, by worker and version (made anew
        with each plan)."""
        self._steps: dict[tuple[int, int], tuple[ServedForm | None, bool]] = {}
        """(held, newest) -> the first step of the way and whether it wants an anchor; made anew
        whenever the forms served change."""

    def published(self, info: VersionInfo, *, restarted: bool) -> None:
        """Record the forms of a new version. `restarted`: a new learner process published
        (its origin serves none of the earlier forms)."""
        if restarted:
            self.offers.clear()
        primary = info.signed.unverified_manifest()  # the caller verified the signatures
        self._offer(info.model_copy(update={"full": None}))
        if info.full is not None:
            self._offer(info.model_copy(update={"signed": info.full, "full": None}))
        if primary.form == "full" or info.full is not None:
            self.anchor_wanted = False  # the anchor asked for is out
        self._drop_unserved()
        self.full_bytes, self.tree_form = primary.loaded_bytes, primary.form
        self._advance(info.version)

    def restore(self, stored: list[VersionInfo]) -> None:
        """After a coordinator restart, the forms the origin served before it (the store keeps
        them, `stored_offers`), so a worker behind still gets deltas, not an anchor. A learner
        restarted as well publishes the newest version again, which clears them."""
        for info in stored:
            self._offer(info)
        self._drop_unserved()

    def stored_offers(self) -> dict[tuple[int, str], str]:
        """The forms served now as (version, form) -> VersionInfo JSON, for the store."""
        return {key: info.model_dump_json() for key, (info, _) in self.offers.items()}

    def manifest(self, version: int, form: str) -> Manifest | None:
        """`version`'s manifest in `form` while the learner's origin serves it (verified when
        the version was published), else None."""
        offered = self.offers.get((version, form))  # type: ignore[call-overload]
        return offered[0].signed.unverified_manifest() if offered is not None else None

    def announced(self, info: VersionInfo) -> VersionInfo:
        """`info` as workers are told of it: the form its relay tree carries, the very object
        a worker's fetch of it is (so a reply can say "fetch the newest" instead of sending it
        twice), else `info` without its anchor's full form."""
        offered = self.offers.get((info.version, info.signed.unverified_manifest().form))
        return offered[0] if offered is not None else info.model_copy(update={"full": None})

    def _offer(self, info: VersionInfo) -> None:
        """One form of a version (`info.signed` is its manifest, `info.full` None)."""
        manifest = info.signed.unverified_manifest()
        self.offers[info.version, manifest.form] = (info, ServedForm(info.version, manifest.base_version,
                                                                manifest.total_bytes))

    def _drop_unserved(self) -> None:
        keep = retained(self.offers, self.config.keep_versions)
        self.offers = {key: value for key, value in self.offers.items() if key in keep}
        self._steps.clear()

    def next_fetch(self, worker_id: str, held: int, latest: VersionInfo, peers: LivePeers | Iterable[PeerLike], *,
                   joiner: PeerLike | None = None) -> tuple[VersionInfo, Assignment] | None:
        """What `worker_id`, holding version `held` (-1: none), pulls next towards `latest`,
        and from where; None when there is no way (it waits for the anchor asked for).
        `joiner`: the worker itself, when `peers` may not list it yet."""
        step = self._first_step(held, latest.version)
        if step is None:
            return None
        info = self.offers[step.version, step.form][0]
        in_plan = step.version == latest.version and step.form == self.tree_form
        return info, self.assignment(worker_id, step.version, latest.origin_url, peers, in_plan=in_plan, joiner=joiner)

    def _first_step(self, held: int, latest: int) -> ServedForm | None:
        """The first fetch on the fewest-bytes way from `held` to `latest`, worked out once per
        version for each version held (thousands of workers hold the same one)."""
        key = (held, latest)
        if key not in self._steps:
            path = cheapest_path(held if held >= 0 else None, latest, [offer for _, offer in self.offers.values()])
            wanted = path is None or path_bytes(path) > self.config.anchor_when_behind * self.full_bytes
            self._steps[key] = (path[0] if path else None, wanted)
        step, wanted = self._steps[key]
        self.anchor_wanted |= wanted
        return step

    def plan_version(self, version: int, origin_url: str, peers: Iterable[PeerLike]) -> BroadcastPlan:
        """The tree for a newly published version, over the workers live at publish time."""
        peers = peers if isinstance(peers, LivePeers) else list(peers)
        return self.adopt(self.make_plan(version, origin_url, peers, self.suspects_for(version)))

    def suspects_for(self, version: int) -> set[str]:
        """The peers no one is sent to for `version` (reports too old for it dropped first)."""
        self._advance(version)
        return self.suspects

    def make_plan(self, version: int, origin_url: str, peers: LivePeers | list[PeerLike],
                  suspects: set[str]) -> BroadcastPlan:
        """The tree for `version` over `peers`, `suspects` relaying for no one. It reads nothing
        of this object that changes, so it may run on a thread while the event loop serves (a
        plan over 10,000 workers takes a few hundred milliseconds). Over the same workers (a
        registry view's membership count names them), suspects and origin, it is the last tree."""
        inputs = (origin_url, frozenset(suspects), fleet_key(peers))
        last = self._planned_from
        if last is not None and last[0] == inputs:
            return _for_version(last[1], version)
        infos = [self._peer_info(p, reachable=bool(p.relay_address) and p.worker_id not in suspects) for p in peers]
        plan = plan_broadcast(version, self._origin(origin_url), infos, self.config)
        tree_order(plan)  # the order its news goes out in, made here on the planning thread
        self._planned_from = (inputs, plan)  # one reference swapped whole: safe to read from the loop
        return plan

    def adopt(self, plan: BroadcastPlan) -> BroadcastPlan:
        """`plan` is the newest version's tree from now on."""
        self._advance(plan.version)
        self._late.clear()
        self._in_plan.clear()
        self.plan = plan
        return plan

    def assignment(self, worker_id: str, version: int, origin_url: str, peers: LivePeers | Iterable[PeerLike], *,
                   in_plan: bool = True, joiner: PeerLike | None = None) -> Assignment:
        """Where `worker_id` pulls `version` from: its place in the plan, or, for a worker that
        joined after the plan was made (or fetches a form the tree does not carry: `in_plan`
        False), any holder of the version (the learner last)."""
        assignment = self._placed(worker_id, version, origin_url, live_peers(peers), in_plan=in_plan, joiner=joiner)
        if self._live(version):  # whom it may report; kept only while a report for it can count
            # tuples of strings: the collector stops tracking them (thousands of workers, each
            # with an entry per live version, would otherwise lengthen every full collection)
            given = self.assigned.setdefault(version, {})
            sources = tuple(s.peer_id for s in assignment.sources)
            if worker_id not in given:
                given[worker_id] = sources
            elif not set(sources) <= set(given[worker_id]):
                given[worker_id] = tuple(dict.fromkeys(given[worker_id] + sources))  # bounded by the live workers
        return assignment

    def _placed(self, worker_id: str, version: int, origin_url: str, peers: LivePeers, *,
                in_plan: bool, joiner: PeerLike | None) -> Assignment:
        if in_plan and self.plan is not None and self.plan.version == version:
            placed = self._in_plan.get(worker_id)
            if placed is None:
                try:
                    placed = self.plan.for_worker(worker_id)
                except ValueError:
                    placed = None  # not in the plan: a late joiner
                if placed is not None and placed.version != version:  # the tree of an earlier version
                    placed = placed.model_copy(update={"version": version})
            if placed is not None:
                self._in_plan[worker_id] = placed  # its JSON is made once per version too
                return self._without_suspects(placed, origin_url, worker_id)
        made = self._late.get((worker_id, version))
        if made is not None:  # one per worker and version: its JSON is made once too
            return self._without_suspects(made, origin_url, worker_id)
        joiner = joiner or peers.get(worker_id)
        if joiner is None:
            raise ValueError(f"worker {worker_id!r} is not live")
        # the fastest usable holders, as many as it may be given (the rest are never looked at)
        usable = (self._info(p) for p in peers.holders(version)
                  if p.worker_id != worker_id and p.relay_address and not self.reports.avoided(p.worker_id, worker_id))
        holders = list(islice(usable, max(0, self.config.max_sources - 1)))
        made = self._late[worker_id, version] = late_joiner_assignment(
            version, self._info(joiner), holders, origin=self._origin(origin_url), config=self.config)
        return made

    def report(self, peer_id: str, reporter_id: str, version: int, *, standing: bool, form: str = "full",
               chunk_index: int = 0, manifest: Manifest | None = None) -> ReportEffect:
        """`reporter_id` says `peer_id` sent bad bytes of `version` (chunk `chunk_index` of its
        `form`, whose manifest is `manifest`). It counts only when the peer was among the
        reporter's sources for that version and the version's reports still count; then
        `RelayReports.report` says what it does. `standing`: groups of the reporter's accepted."""
        if peer_id == ORIGIN_ID or peer_id == reporter_id or not self._live(version):
            return "none"
        if peer_id not in self.assigned.get(version, {}).get(reporter_id, ()):
            return "none"  # never sent there for that version: nothing it says of the peer counts
        return self.reports.report(peer_id, reporter_id, version, standing=standing, form=form,
                                   chunk_index=chunk_index, manifest=manifest)

    @property
    def suspects(self) -> set[str]:
        """The peers no one is sent to now."""
        return self.reports.suspects

    def forget(self, worker_id: str) -> None:
        """A worker gone for good: its reports, the reports against it and its assignments go too."""
        self.reports.forget(worker_id)
        for given in self.assigned.values():
            given.pop(worker_id, None)

    def _live(self, version: int) -> bool:
        """A report for `version` still counts (and what was assigned for it is still kept)."""
        return self.reports.live(version)

    def _advance(self, version: int) -> None:
        """A new newest version: the reports and assignments that no longer count are dropped."""
        self.newest = max(self.newest, version)
        self.reports.advance(version)
        self.assigned = {v: given for v, given in self.assigned.items() if self._live(v)}

    def _without_suspects(self, assignment: Assignment, origin_url: str, worker_id: str) -> Assignment:
        if not self.reports:  # no report counts now: nobody is avoided
            return assignment
        sources = [s for s in assignment.sources if not self.reports.avoided(s.peer_id, worker_id)]
        if len(sources) == len(assignment.sources):
            return assignment
        if not sources:  # every source a suspect (max_sources = 1): the learner serves it itself
            sources = [Source(peer_id=ORIGIN_ID, url=origin_url)]
        # validated again (model_copy would not): an assignment never goes out without a source
        return Assignment.model_validate({**assignment.model_dump(), "sources": sources})

    def _origin(self, url: str) -> OriginInfo:
        return OriginInfo(url=url, upload_bytes_per_s=bytes_per_s(self.learner_upload_bps))

    def _info(self, peer: PeerLike) -> PeerInfo:
        return self._peer_info(peer, reachable=bool(peer.relay_address) and not self.reports.suspected(peer.worker_id))

    def _peer_info(self, peer: PeerLike, *, reachable: bool) -> PeerInfo:
        return PeerInfo(peer_id=peer.worker_id, url=peer.relay_address if reachable else "",
                        upload_bytes_per_s=bytes_per_s(peer.upload_bps),
                        download_bytes_per_s=bytes_per_s(peer.download_bps),
                        reachable=reachable)


def _for_version(plan: BroadcastPlan, version: int) -> BroadcastPlan:
    """`plan`'s tree for another version. Its assignments stay the tree's, made for the version
    it was planned for: a worker's is made for this version when it is asked for (`_placed`),
    so a version costs the workers told of it, not one copy per worker (10,000 of them held
    the event loop's share of the interpreter for tens of milliseconds a version)."""
    return plan.model_copy(update={"version": version})
