"""Published versions: the checks a publish must pass (signed by the pinned learner key, the
next version or the newest again, an anchor's full form next to its delta), the pinned key
itself, and the glue to the dissemination planner that tells each worker what to fetch next
and from where."""

from __future__ import annotations

from echo2.broadcast.signing import (
    ManifestRejected,
    load_public_key,
    public_key_from_hex,
    public_key_hex,
    verify_manifest,
)
from echo2.config.broadcast import BroadcastConfig
from echo2.coordinator.parts.dissemination import Dissemination
from echo2.coordinator.parts.peers import LivePeers, PeerLike
from echo2.coordinator.records.errors import RequestError
from echo2.coordinator.records.events import Event, PublishReplayed, VersionPublished
from echo2.coordinator.records.store import Store
from echo2.protocol.broadcast import BroadcastPlan
from echo2.protocol.messages import VersionInfo


class VersionDesk:
    def __init__(self, store: Store, broadcast: BroadcastConfig, learner_upload_bps: float) -> None:
        self.store = store
        self.dissemination = Dissemination(broadcast, learner_upload_bps)
        latest = store.get_meta("latest")
        self.latest: VersionInfo | None = VersionInfo.model_validate(latest) if latest else None
        self.announced: VersionInfo | None = self.dissemination.announced(self.latest) if self.latest else None
        """The newest version as workers are told of it (its anchor's full form left out): made
        once per version, so its JSON is made once too."""
        self.unplanned: tuple[str, bool] | None = None
        """The newest version's form and whether it is an anchor, until its tree is planned."""
        if self.latest is not None:  # with the earlier forms the origin serves: workers behind get deltas
            self.dissemination.published(self.latest, restarted=True)
            self.dissemination.restore([VersionInfo.model_validate_json(info) for info in store.offers()])
        # broadcast.learner_public_key, when set, pins the learner key from the start
        pinned_key = broadcast.learner_public_key
        configured = public_key_hex(load_public_key(pinned_key)) if pinned_key else ""
        stored = store.get_meta("learner_public_key", "")
        if stored and configured and stored != configured:
            raise ValueError(f"broadcast.learner_public_key ({configured[:16]}...) is not the key this run's versions "
                             f"were published with ({stored[:16]}...)")
        self.public_key_hex: str = stored or configured

    @property
    def current(self) -> int:
        """The newest published version (-1: none yet)."""
        return self.latest.version if self.latest else -1

    def check(self, version: int, field_name: str) -> None:
        if version > self.current:
            raise RequestError(422, f"{field_name}={version} is from the future: newest published version is "
                                    f"{self.current}")

    def next_fetch(self, worker_id: str, held: int, peers: LivePeers, *, joiner: PeerLike | None = None):
        """What the worker pulls next towards the newest version, and from where; None when it
        holds the newest already (or waits for an anchor)."""
        if self.latest is None or held >= self.latest.version:
            return None
        return self.dissemination.next_fetch(worker_id, held, self.latest, peers, joiner=joiner)

    def publish(self, info: VersionInfo, public_key_hex: str, peers: LivePeers) -> tuple[Event, bool]:
        """Accept a version (`accept`) and plan its relay tree over `peers` at once. Returns its
        event and whether the learner should make its next version an anchor; a
        `PublishReplayed` event means nothing changed (an older version)."""
        replayed, wanted = self.accept(info, public_key_hex)
        if replayed is not None:
            return replayed, wanted
        return self.planned(self.dissemination.plan_version(info.version, info.origin_url, peers)), wanted

    def accept(self, info: VersionInfo, public_key_hex: str) -> tuple[PublishReplayed | None, bool]:
        """Accept a version from the learner: signed by the pinned learner key (broadcast.
        learner_public_key, or the key of the run's first publish), and the next version or the
        newest again; its relay tree is planned next (`planned`, or on a thread by the server).
        Returns a `PublishReplayed` event when nothing changed (an older version), and whether
        the learner should make its next version an anchor."""
        pinned = self.public_key_hex or public_key_hex
        if public_key_hex != pinned:
            raise RequestError(409, f"publish signed by key {public_key_hex[:16]}...; this run's learner key is "
                                    f"{pinned[:16]}... (pinned at the first publish or by "
                                    "broadcast.learner_public_key)")
        try:
            manifest = verify_manifest(info.signed, public_key_from_hex(pinned), held_version=None, check_base=False)
        except (ManifestRejected, ValueError) as exc:
            raise RequestError(422, f"publish of version {info.version} refused: {exc}") from None
        if manifest.version != info.version:
            raise RequestError(422, f"publish says version {info.version}, its signed manifest {manifest.version}")
        self._check_full_form(info, manifest, pinned)
        newest = self.current
        if self.latest is not None and info.version < newest:
            return PublishReplayed(version=info.version, latest=newest), False
        # the newest version again is a restarted learner serving it from its new origin: workers
        # that had not finished it can only get it there, so it is announced anew
        if self.latest is not None and info.version not in (newest, newest + 1):
            raise RequestError(422, f"publish of version {info.version} skips ahead: the newest is {newest}, so the "
                                    f"next is {newest + 1}")
        # the newest version again, or a new origin: a restarted learner, serving none of the forms before
        restarted = self.latest is None or info.version == newest or info.origin_url != self.latest.origin_url
        self.dissemination.published(info, restarted=restarted)
        with self.store.tx():
            self.store.set_meta("learner_public_key", pinned)
            self.store.set_meta("latest", info.model_dump())
            self.store.keep_offers(self.dissemination.stored_offers(), replace=restarted)
        self.public_key_hex, self.latest = pinned, info
        self.announced = self.dissemination.announced(info)
        self.unplanned = (manifest.form, info.full is not None or manifest.form == "full")
        wanted, self.dissemination.anchor_wanted = self.dissemination.anchor_wanted, False
        return None, wanted

    def planned(self, plan: BroadcastPlan) -> VersionPublished:
        """The newest version's tree is `plan` (made for it): its event."""
        form, anchor = self.unplanned or ("full", False)
        self.unplanned = None
        self.dissemination.adopt(plan)
        return VersionPublished(version=plan.version, broadcast_mode=plan.mode, first_hop=plan.origin_children,
                                max_depth=max((a.depth for a in plan.assignments), default=0), form=form,
                                anchor=anchor)

    def _check_full_form(self, info: VersionInfo, manifest, pinned: str) -> None:
        """An anchor's full manifest rides next to its delta: the same version, signed alike."""
        if info.full is None:
            return
        try:
            full = verify_manifest(info.full, public_key_from_hex(pinned), held_version=None)
        except (ManifestRejected, ValueError) as exc:
            raise RequestError(422, f"publish of version {info.version} refused: its full form: {exc}") from None
        if full.version != info.version or full.form != "full" or manifest.form != "delta":
            raise RequestError(422, f"publish of version {info.version}: `full` must be the full form of the same "
                                    f"version next to a delta `signed` (got {full.form} {full.version} next to "
                                    f"{manifest.form} {manifest.version})")
