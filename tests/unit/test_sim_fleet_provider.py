"""The simulator's fleet follows the real fleet rule: the same FleetSync turns activation records
into acquires and releases on a simulated provider, each machine bills from its acquire to its
release (or loss), boot included, as the ssh and skypilot ledgers bill, and the result reports
the bill under a real run summary's keys."""

from __future__ import annotations

import pytest
from test_sim_activation import _scenario

from echo2.config.sim import ScenarioConfig
from echo2.policy.fleet_sync import FleetSync
from echo2.sim import control
from echo2.sim.dataplane import SimDataPlane
from echo2.sim.events import EventLoop
from echo2.sim.fleet import Fleet, build_workers
from echo2.sim.provider import SimProvider
from echo2.sim.simulator import simulate

PRICE_PER_HOUR = 3.6  # $0.001 a second: dollars are seconds / 1000
BOOT_S, RELEASE_AFTER_S = 30.0, 50.0


class Run:
    """Two offered machines of one class, a simulated provider and FleetSync on the sim clock;
    the test writes the coordinator's decisions and the launcher's ticks by hand."""

    def __init__(self) -> None:
        scenario = ScenarioConfig.model_validate({
            "learner": {"price_per_hour": 10.0, "uplink_bps": 1e9},
            "workers": {"gpu": {"count": 2, "price_per_hour": PRICE_PER_HOUR, "rollouts_per_s": 1.0,
                                "bandwidth_bps": 1e9, "boot_s": BOOT_S, "mean_downtime_s": 1e9}},
            "workload": {"params": 1e8, "prompts_per_step": 4, "group_size": 4, "step_time_s": 10.0,
                         "max_staleness": 3, "generation_time_s": 8.0},
        })
        self.loop = EventLoop()
        self.fleet = Fleet(scenario, build_workers(scenario), self.loop, SimDataPlane(3, 4))
        self.provider = SimProvider(self.fleet, releasable=True, not_started={"w0", "w1"})
        self.sync = FleetSync(self.provider, RELEASE_AFTER_S)
        self.registered: list[tuple[float, str]] = []
        self.fleet.on_registered = self._registered
        self.fleet.on_left = lambda w, released: (self.record("worker_left", worker_id=w.id, released=True)
                                                  if released else self.record("worker_lost", worker_id=w.id))
        for w in self.fleet.workers:  # both machines can be had from the start; none is rented
            self.loop.at(0.0, self.fleet.join, w, 0.0)

    def _registered(self, w) -> None:
        self.registered.append((self.loop.now_s, w.id))
        self.record("worker_registered", worker_id=w.id)

    def record(self, kind: str, **values) -> None:
        now = self.loop.now_s
        self.sync.observe({"role": "coordinator", "kind": kind, "time": now, **values}, now)

    def decide_at(self, time_s: float, active: list[str]) -> None:
        def decide() -> None:
            self.record("activation", active=active)
            self.sync.step(self.loop.now_s)
        self.loop.at(time_s, decide)

    def tick_until(self, end_s: float, every_s: float = 10.0) -> None:
        """The launcher's loop: a FleetSync step every `every_s`."""
        for i in range(1, int(end_s / every_s) + 1):
            self.loop.at(i * every_s, lambda: self.sync.step(self.loop.now_s))

    def billed_s(self, end_s: float) -> dict[str, float]:
        self.loop.run(horizon_s=end_s)
        self.fleet.close_billing()
        return {w.id: w.billed_s for w in self.fleet.workers}


def test_each_machine_bills_from_acquire_to_release_or_loss_boot_included():
    """Both acquired at 0 (booted at 30); w1 left out at 100, released at the first tick 50 s
    later, chosen again at 400 and booted again by 430; w0 preempted at 700 and lost."""
    run = Run()
    run.decide_at(0.0, ["w0", "w1"])
    run.decide_at(100.0, ["w0"])
    run.decide_at(400.0, ["w0", "w1"])
    run.tick_until(1000.0)
    w0 = run.fleet.workers[0]
    run.loop.at(700.0, lambda: run.fleet.preempt(w0, w0.epoch))
    billed = run.billed_s(1000.0)
    # the ledger by hand: w0 [0, 700] lost; w1 [0, 150] released, [400, 1000] held at the end
    assert billed == pytest.approx({"w0": 700.0, "w1": 150.0 + 600.0})
    dollars = sum(billed.values()) * PRICE_PER_HOUR / 3600
    assert dollars == pytest.approx(1.45)
    assert run.registered == [(30.0, "w0"), (30.0, "w1"), (430.0, "w1")]  # every acquire boots
    assert (run.provider.acquires, run.provider.releases) == (3, 1)
    # the lost machine is not FleetSync's to release: gone by itself, and billing nothing
    assert run.provider.released() == set() and "w0" not in run.sync.joined


def test_a_preempted_machine_back_without_a_spare_boots_again_and_bills_from_its_return():
    run = Run()
    run.decide_at(0.0, ["w0"])
    run.tick_until(500.0)
    w0 = run.fleet.workers[0]
    run.loop.at(100.0, lambda: run.fleet.preempt(w0, w0.epoch))
    run.loop.at(300.0, run.fleet.join, w0)  # its machine back (the class's mean_downtime_s)
    billed = run.billed_s(500.0)
    assert billed["w0"] == pytest.approx(100.0 + 200.0)  # nothing billed while it was gone
    assert run.registered == [(30.0, "w0"), (300.0 + BOOT_S, "w0")]


def test_a_released_and_reacquired_worker_bills_both_spans_and_both_boots():
    """Released after its first boot and chosen again: the second span bills its boot too, so
    the worker costs two boots more than the time it could work."""
    run = Run()
    run.decide_at(0.0, ["w0"])
    run.decide_at(40.0, [])  # registered at 30, idle from 40, released at the tick at 90
    run.decide_at(200.0, ["w0"])
    run.tick_until(300.0)
    billed = run.billed_s(300.0)
    assert billed["w0"] == pytest.approx(90.0 + 100.0)  # [0, 90] and [200, 300]
    assert billed["w1"] == 0.0  # offered, never chosen: never billed
    working_s = (40.0 - BOOT_S) + (300.0 - 200.0 - BOOT_S)  # registered time inside the bill
    assert billed["w0"] - working_s == pytest.approx(2 * BOOT_S + 50.0)  # two boots and the idle spell


def test_the_simulator_releases_and_acquires_as_a_launcher_following_its_records(monkeypatch):
    """A whole simulated run's records, replayed into a fresh FleetSync the way a launcher reads a
    run's metrics (a tick every 5 s; every record time here is a multiple of 5), over a provider
    that only records calls: the same acquires and releases, at the same times."""
    records: list[dict] = []
    calls: list[tuple[float, str, str]] = []

    class RecordedSync(FleetSync):
        def observe(self, record: dict, now: float) -> None:
            records.append(record)
            super().observe(record, now)

    class RecordedProvider(SimProvider):
        def acquire(self, worker_id: str) -> None:
            calls.append((self.fleet.loop.now_s, "acquire", worker_id))
            super().acquire(worker_id)

        def release(self, worker_id: str) -> None:
            calls.append((self.fleet.loop.now_s, "release", worker_id))
            super().release(worker_id)

    monkeypatch.setattr(control, "FleetSync", RecordedSync)
    monkeypatch.setattr(control, "SimProvider", RecordedProvider)
    # noisy step times move the demand, so the controller scales up and down; no preemption
    scenario = _scenario("online", rollouts_per_s=0.3, boot_s=20.0)
    scenario = scenario.model_copy(update={
        "activation": scenario.activation.model_copy(update={"release_after_s": 65.0}),
        "sim": scenario.sim.model_copy(update={"step_time_cv": 1.0, "steps": 120})})
    result = simulate(scenario)
    released = [c for c in calls if c[1] == "release"]
    assert len(released) >= 5 and result.releases == len(released) and result.preemptions == 0
    assert all(r["time"] % 5 == 0 for r in records)

    replayed = RecordingProvider({f"w{i}" for i in range(12)})  # 10 cheap and 2 dear, all offered
    sync = FleetSync(replayed, 65.0)
    for i in range(int(max(r["time"] for r in records) / 5) + 1):
        replayed.now = now = i * 5.0
        sync.step(now)  # a release due now comes before the records it causes
        for record in (r for r in records if r["time"] == now):
            sync.observe(record, now)
        sync.step(now)
    assert replayed.calls == calls


class RecordingProvider:
    """A releasable provider that only records its calls; every worker offered, none started."""

    releasable = True

    def __init__(self, worker_ids: set[str]) -> None:
        self.ids, self.released_ids = set(worker_ids), set(worker_ids)
        self.calls: list[tuple[float, str, str]] = []
        self.now = 0.0

    def worker_ids(self) -> set[str]:
        return set(self.ids)

    def released(self) -> set[str]:
        return set(self.released_ids)

    def release(self, worker_id: str) -> None:
        self.released_ids.add(worker_id)
        self.calls.append((self.now, "release", worker_id))

    def acquire(self, worker_id: str) -> None:
        self.released_ids.discard(worker_id)
        self.calls.append((self.now, "acquire", worker_id))

    def observe(self, record: dict) -> None:
        pass


def test_the_result_reports_the_bill_under_the_run_summarys_keys():
    result = simulate(_scenario("online", boot_s=25.0))
    summary = result.as_run_summary()
    fleet = summary["fleet"]
    per_worker = result.to_dict(per_worker=True)["per_worker"]
    assert fleet["billed_s"] == pytest.approx(sum(w["billed_s"] for w in per_worker))
    price_per_hour = {"cheap": 0.3, "dear": 3.0}
    assert fleet["billed_usd"] == pytest.approx(sum(w["billed_s"] * price_per_hour[w["class"]] / 3600
                                                    for w in per_worker))
    assert fleet["billed_usd_per_step"] == pytest.approx(fleet["billed_usd"] / result.steps_done)
    assert fleet["billed_usd_per_group"] == pytest.approx(fleet["billed_usd"] / result.groups["trained"])
    assert result.groups["trained"] == result.steps_done * 4  # 4 prompts a step
    assert summary["learner_utilization"] == result.utilization > 0.9


@pytest.mark.parametrize("provider", ["ssh", "skypilot"])
def test_ssh_and_skypilot_are_releasable_providers_as_local_is(provider):
    scenario = _scenario("online", provider=provider, boot_s=25.0, mean_uptime_s=600.0, mean_downtime_s=300.0)
    named, local = simulate(scenario), simulate(_scenario("online", boot_s=25.0, mean_uptime_s=600.0,
                                                          mean_downtime_s=300.0))
    assert named.releases > 0
    assert named.to_dict() | {"run_s": 0} == local.to_dict() | {"run_s": 0}
