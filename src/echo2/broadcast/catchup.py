"""Which published forms of which versions stay served, and the cheapest way for a worker to
reach the newest version from the one it holds (pure functions; the learner's origin and the
coordinator apply the same rules, so the coordinator never plans a fetch the origin dropped).

Every version is published in one or two forms: a delta against the previous version, a full
snapshot, or both (an anchor: see `BroadcastConfig.anchor_every`). A worker holding version b
reaches the newest version v along a chain of fetches, each a full form (from nothing) or a delta
whose base it holds by then. The cheapest chain by bytes is a shortest path over versions in
increasing order:

    cost(b) = 0,    cost(u) = min( full_bytes(u),  min over deltas (u, base) of cost(base) + bytes )

A worker that holds nothing (a late joiner) takes the newest anchor plus the deltas after it; one
that missed a few versions takes the deltas it missed, unless an anchor and its deltas are fewer
bytes. Versions are never fetched backwards: a relay refuses a version older than the one it holds.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

from echo2.protocol.manifest import Form


@dataclass(frozen=True)
class ServedForm:
    """One fetchable form of one version (a full snapshot or a delta) and its size."""

    version: int
    base_version: int | None
    """None: a full snapshot; else a delta against this version."""
    total_bytes: int

    @property
    def form(self) -> Form:
        return "full" if self.base_version is None else "delta"


def retained(keys: Iterable[tuple[int, Form]], keep_versions: int, *,
             since_anchor: bool = True) -> set[tuple[int, Form]]:
    """The (version, form) pairs a relay keeps serving: the newest `keep_versions` versions,
    and (`since_anchor`: the learner's origin) every version since the newest full one (the
    anchor a late joiner starts from, and the deltas it needs after it). With full versions
    only, that is the newest keep_versions either way."""
    keys = set(keys)
    versions = sorted({version for version, _ in keys})
    newest = set(versions[-keep_versions:])
    anchor = max((version for version, form in keys if form == "full"), default=None) if since_anchor else None
    return {(v, f) for v, f in keys if v in newest or (anchor is not None and v >= anchor)}


def cheapest_path(held: int | None, target: int, offers: Iterable[ServedForm]) -> list[ServedForm] | None:
    """The fewest-bytes chain of fetches from `held` (None: nothing) to `target`, in order; None
    when no chain exists (the deltas it would need are no longer served and no anchor follows)."""
    by_version: dict[int, list[ServedForm]] = {}
    for offer in offers:
        if held is None or offer.version > held:
            by_version.setdefault(offer.version, []).append(offer)
    cost: dict[int, int] = {held: 0} if held is not None else {}
    via: dict[int, ServedForm] = {}
    for version in sorted(v for v in by_version if v <= target):
        for offer in by_version[version]:
            start = 0 if offer.base_version is None else cost.get(offer.base_version)
            if start is not None and start + offer.total_bytes < cost.get(version, start + offer.total_bytes + 1):
                cost[version], via[version] = start + offer.total_bytes, offer
    if target not in via:
        return None
    path, version = [], target
    while version in via:
        offer = via[version]
        path.append(offer)
        if offer.base_version is None:
            break
        version = offer.base_version
    return path[::-1]


def path_bytes(path: list[ServedForm]) -> int:
    return sum(offer.total_bytes for offer in path)
