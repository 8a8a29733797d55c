"""FleetSync: the coordinator's activation decisions become release and acquire calls on the
fleet provider: only registered workers idle for release_after_s are released, a released one the
controller chooses is acquired, and the static provider is never asked to release. The rule is in
policy/fleet_sync.py, where the simulator drives it too; the launchers import it from
launch/fleet.py."""

from __future__ import annotations

from echo2.launch import fleet as launch_fleet
from echo2.launch.fleet import LocalFleet, StaticFleet
from echo2.policy.fleet_sync import FleetSync
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


def test_the_launchers_and_the_simulator_share_one_rule():
    assert launch_fleet.FleetSync is FleetSync


def test_a_worker_back_from_a_loss_idles_from_its_return_not_from_before():
    """Away is not idle: a worker lost while left out, back (registered) long after, is released
    release_after_s after its return, not at once for the time it was gone."""
    fleet = RecordingFleet({"w0", "w1"})
    sync = _sync(fleet)
    sync.observe(_coordinator("activation", active=["w0"]), now=0.0)
    sync.observe(_coordinator("worker_lost", worker_id="w1"), now=1.0)
    sync.step(now=100.0)
    assert fleet.calls == [] and sync.release_due_s() is None  # gone: nothing to release
    sync.observe(_coordinator("worker_registered", worker_id="w1"), now=100.0)
    assert sync.release_due_s() == 105.0
    sync.step(now=104.9)
    assert fleet.calls == []
    sync.step(now=105.0)
    assert fleet.calls == [("release", "w1")]


def test_a_released_worker_its_provider_takes_back_by_itself_starts_with_no_idle_time():
    """A provider may hand a released (offered) machine out by itself, as a spare in a lost one's
    place: it was never idle while released, so it is not released the moment it registers."""
    fleet = RecordingFleet({"w0", "w1"})
    fleet.released_ids = {"w1"}
    sync = FleetSync(fleet, 5.0)
    sync.observe(_coordinator("worker_registered", worker_id="w0"), now=0.0)
    sync.observe(_coordinator("activation", active=["w0"]), now=0.0)
    fleet.released_ids.clear()  # the provider took w1 as a spare at 50 s
    sync.observe(_coordinator("worker_registered", worker_id="w1"), now=50.0)
    sync.step(now=50.0)
    assert fleet.calls == [] and sync.release_due_s() == 55.0  # idle from its registration


def test_release_due_s_is_the_first_step_that_releases():
    """A caller on its own clock (the simulator) steps exactly when a release comes due."""
    fleet = RecordingFleet({"w0", "w1"})
    sync = _sync(fleet, release_after_s=4.0)
    assert sync.release_due_s() is None  # no decision yet
    sync.observe(_coordinator("activation", active=["w0"]), now=0.1)
    due_s = sync.release_due_s()
    assert due_s == 0.1 + 4.0 and due_s - 0.1 < 4.0  # idle 4 s only as a deadline, not by subtraction
    sync.step(now=due_s)
    assert fleet.calls == [("release", "w1")] and sync.release_due_s() is None


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


class SlowStopFleet(RecordingFleet):
    """Its stops take a while (as over SSH): an acquire before one is done does nothing."""

    def __init__(self, worker_ids: set[str]) -> None:
        super().__init__(worker_ids)
        self.stopping: set[str] = set()

    def release(self, worker_id: str) -> None:
        super().release(worker_id)
        self.stopping.add(worker_id)

    def acquire(self, worker_id: str) -> None:
        if worker_id not in self.stopping:
            super().acquire(worker_id)


def _release_w1_then_choose_it_again(fleet: SlowStopFleet) -> FleetSync:
    sync = _sync(fleet)
    sync.observe(_coordinator("activation", active=["w0"]), now=0.0)
    sync.step(now=5.0)
    assert fleet.calls == [("release", "w1")]
    sync.observe(_coordinator("activation", active=["w0", "w1"]), now=5.5)  # chosen again, stop under way
    sync.step(now=5.5)
    return sync


def test_a_worker_chosen_again_while_its_release_was_under_way_is_acquired_back():
    """The coordinator saw it leave while chosen and took that for a departure: no later decision
    will choose it (it is no candidate), so the fleet rule brings it back once its stop is done,
    and it registers as a candidate again. Left released, the run would have lost a machine."""
    fleet = SlowStopFleet({"w0", "w1"})
    sync = _release_w1_then_choose_it_again(fleet)
    sync.observe(_coordinator("worker_left", worker_id="w1", released=False), now=6.0)
    sync.observe(_coordinator("activation", active=["w0"]), now=6.5)
    sync.step(now=6.5)
    assert fleet.calls == [("release", "w1")]  # its stop is not done
    fleet.stopping.clear()
    sync.step(now=8.0)
    sync.step(now=9.0)
    assert fleet.calls == [("release", "w1"), ("acquire", "w1")] and fleet.released() == set()


def test_a_worker_whose_leave_was_taken_for_a_release_waits_for_the_decisions():
    fleet = SlowStopFleet({"w0", "w1"})
    sync = _release_w1_then_choose_it_again(fleet)
    sync.observe(_coordinator("activation", active=["w0"]), now=5.8)
    sync.observe(_coordinator("worker_left", worker_id="w1", released=True), now=6.0)  # still a candidate
    fleet.stopping.clear()
    sync.step(now=8.0)
    assert fleet.calls == [("release", "w1")] and fleet.released() == {"w1"}


def test_a_worker_that_departed_by_itself_is_not_acquired_back():
    fleet = SlowStopFleet({"w0", "w1"})
    sync = _sync(fleet)
    sync.observe(_coordinator("activation", active=["w0", "w1"]), now=0.0)
    sync.observe(_coordinator("worker_left", worker_id="w1", released=False), now=1.0)
    sync.observe(_coordinator("activation", active=["w0"]), now=1.5)
    sync.step(now=100.0)
    assert fleet.calls == []
