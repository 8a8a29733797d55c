"""FleetSync: the coordinator's activation decisions become release and acquire calls on the
fleet provider: only registered workers idle for release_after_s are released, a released one the
controller chooses is acquired, and the static provider is never asked to release."""

from __future__ import annotations

from echo2.launch.fleet import FleetSync, LocalFleet, StaticFleet
from echo2.report.metrics import MetricsWriter


class RecordingFleet:
    """A releasable provider that only records the calls (the processes are the launcher's:
    tests/integration/test_fleet.py drives the real LocalFleet)."""

    releasable = True

    def __init__(self, worker_ids: set[str]) -> None:
        self.ids, self.released_ids, self.calls = set(worker_ids), set(), []

    def worker_ids(self) -> set[str]:
        return set(self.ids)

    def released(self) -> set[str]:
        return set(self.released_ids)

    def release(self, worker_id: str) -> None:
        self.released_ids.add(worker_id)
        self.calls.append(("release", worker_id))

    def acquire(self, worker_id: str) -> None:
        self.released_ids.discard(worker_id)
        self.calls.append(("acquire", worker_id))

    def observe(self, record: dict) -> None:
        pass


def _coordinator(kind: str, **values) -> dict:
    return {"role": "coordinator", "kind": kind, **values}


def _sync(provider, release_after_s: float = 5.0) -> FleetSync:
    sync = FleetSync(provider, release_after_s)
    for worker_id in ("w0", "w1"):
        sync.observe(_coordinator("worker_registered", worker_id=worker_id), now=0.0)
    return sync


def test_an_idle_worker_is_released_after_the_delay_and_acquired_when_chosen():
    fleet = RecordingFleet({"w0", "w1", "w2"})  # w2 never registered (still loading)
    sync = _sync(fleet)
    sync.observe(_coordinator("activation", active=["w0"]), now=10.0)
    sync.step(now=14.9)
    assert fleet.calls == []  # not idle long enough
    sync.step(now=15.0)
    assert fleet.calls == [("release", "w1")]
    sync.step(now=30.0)
    assert fleet.calls == [("release", "w1")]  # released once
    sync.observe(_coordinator("activation", active=["w0", "w1"]), now=31.0)
    sync.step(now=31.0)
    assert fleet.calls[-1] == ("acquire", "w1") and fleet.released() == set()


def test_a_worker_that_left_by_itself_is_not_released():
    fleet = RecordingFleet({"w0", "w1"})
    sync = _sync(fleet)
    sync.observe(_coordinator("activation", active=["w0"]), now=0.0)
    sync.observe(_coordinator("worker_left", worker_id="w1"), now=1.0)
    sync.step(now=100.0)
    assert fleet.calls == []


def test_the_static_fleet_is_never_asked_to_release():
    fleet = StaticFleet({"w0", "w1"})
    sync = _sync(fleet, release_after_s=0.0)
    sync.observe(_coordinator("activation", active=["w0"]), now=0.0)
    sync.step(now=3600.0)  # would raise if release were called
    assert fleet.released() == set()


def test_workers_offered_unstarted_are_acquired_only_when_chosen_and_old_decisions_are_ignored(tmp_path):
    """The local fleet's workers started on demand count as released until chosen; a resumed
    run's metrics begin with the last run's decisions, which this launcher must not act on."""
    started: list[str] = []

    def start(worker_id: str):
        started.append(worker_id)
        return FakeChild()

    fleet = LocalFleet({}, start, MetricsWriter(tmp_path / "metrics.jsonl", "launcher"),
                       not_started={"w0", "w1", "w2"})
    assert fleet.worker_ids() == fleet.released() == {"w0", "w1", "w2"}
    sync = FleetSync(fleet, release_after_s=5.0, since=100.0)
    sync.observe(_coordinator("activation", active=["w0", "w1", "w2"], time=50.0), now=0.0)  # the last run's
    sync.step(now=0.0)
    assert started == []
    sync.observe(_coordinator("activation", active=["w1"], time=101.0), now=1.0)
    sync.step(now=1.0)
    sync.step(now=60.0)
    assert started == ["w1"] and fleet.released() == {"w0", "w2"}  # the others never started nor billed
    assert fleet.worker_ids() == {"w0", "w1", "w2"}


class FakeChild:
    pid = 4242

    def exit_code(self):
        return None
