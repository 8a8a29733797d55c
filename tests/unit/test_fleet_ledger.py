"""The fleet ledger: what was acquired and not released is what the run still pays for, from the
file alone (as `echo2 fleet down --all` reads it after a SIGKILL); billing runs from each acquire
to its release, boot included, and a worker acquired twice bills twice."""

from __future__ import annotations

import echo2.report.fleet_ledger as ledger_module
from echo2.report.fleet_ledger import LEDGER_NAME, FleetLedger


def test_held_machines_are_those_acquired_and_not_released(tmp_path):
    ledger = FleetLedger(tmp_path)
    ledger.acquiring("a-0", provider="ssh", machine="a", worker_class="cheap", price_per_hour=1.0)
    ledger.started("a-0", pid=4242)
    ledger.acquiring("b-0", provider="ssh", machine="b", worker_class="fast", price_per_hour=3.0)  # never started
    ledger.acquiring("c-0", provider="ssh", machine="c", worker_class="fast", price_per_hour=3.0)
    ledger.started("c-0", pid=7)
    ledger.released("c-0", reason="idle")
    held = FleetLedger(tmp_path).held()  # a fresh reader: the file alone
    assert set(held) == {"a-0", "b-0"}
    assert held["a-0"].details == {"pid": 4242} and held["a-0"].machine == "a"
    assert held["b-0"].details == {}  # acquired, never started: still to be released


def test_billing_runs_from_acquire_to_release_and_counts_each_acquire(tmp_path, monkeypatch):
    clock = iter([0.0, 5.0, 3600.0, 7200.0, 7210.0])
    monkeypatch.setattr(ledger_module.time, "time", lambda: next(clock))
    ledger = FleetLedger(tmp_path)
    ledger.acquiring("a-0", provider="ssh", machine="a", worker_class="cheap", price_per_hour=2.0)  # t=0
    ledger.started("a-0", pid=1)  # t=5: boot is billed too
    ledger.released("a-0", reason="idle")  # t=3600
    ledger.acquiring("a-0", provider="ssh", machine="a", worker_class="cheap", price_per_hour=2.0)  # t=7200
    ledger.started("a-0", pid=2)  # t=7210
    assert ledger.billed_usd(now=7200.0 + 1800.0) == 2.0 + 1.0  # one hour, then half an hour still held
    assert set(ledger.held()) == {"a-0"} and ledger.held()["a-0"].details == {"pid": 2}


def test_a_line_cut_short_by_a_crash_loses_nothing_before_it(tmp_path):
    ledger = FleetLedger(tmp_path)
    ledger.acquiring("a-0", provider="ssh", machine="a", worker_class="cheap", price_per_hour=1.0)
    with open(tmp_path / LEDGER_NAME, "a") as handle:
        handle.write('{"event": "released", "worker_id": "a-')
    assert set(ledger.held()) == {"a-0"}


def test_the_summary_bills_the_fleet_per_step_and_per_group(tmp_path, monkeypatch):
    from echo2.report.finish import finish_run
    from echo2.report.metrics import MetricsWriter

    clock = iter([0.0, 10.0, 1800.0, 1800.0])
    monkeypatch.setattr(ledger_module.time, "time", lambda: next(clock))
    ledger = FleetLedger(tmp_path)
    ledger.acquiring("a-0", provider="ssh", machine="a", worker_class="cheap", price_per_hour=2.0)  # t=0
    ledger.started("a-0", pid=1)  # t=10: the boot bills too
    ledger.released("a-0", reason="shutdown")  # t=1800: $1
    ledger.acquiring("b-0", provider="ssh", machine="b", worker_class="", price_per_hour=0.0)  # refused at once
    monkeypatch.undo()
    coordinator, learner = (MetricsWriter(tmp_path / "metrics.jsonl", role) for role in ("coordinator", "learner"))
    for step in range(4):
        coordinator.write("batch_assigned", step=step, staleness_hist={"0": 3, "1": 2})
        learner.write("train_step", step=step, wait_s=0.1, train_s=1.0, publish_s=0.1, reward_mean=0.5,
                      staleness_max=1, staleness_hist={"0": 3, "1": 2})
    coordinator.close()
    learner.close()
    fleet = finish_run(tmp_path, plots=False)["fleet"]
    assert fleet["billed_usd"] == 1.0 and fleet["groups_trained"] == 20
    assert fleet["billed_usd_per_step"] == 0.25 and fleet["billed_usd_per_group"] == 0.05
    assert fleet["billed_by_worker"]["a-0"] == {"worker_class": "cheap", "machine": "a", "billed_s": 1800.0,
                                                "billed_usd": 1.0, "acquires": 1}
    assert fleet["held_at_end"] == ["b-0"]


def test_a_cached_ledger_reads_again_only_when_the_file_changed(tmp_path):
    ledger, cached = FleetLedger(tmp_path), ledger_module.CachedLedger(tmp_path)
    assert cached.bill() == {}
    ledger.acquiring("a-0", provider="ssh", machine="a", worker_class="", price_per_hour=1.0)
    assert cached.held().keys() == {"a-0"}
    first = cached.cached
    assert cached.held().keys() == {"a-0"} and cached.cached is first  # unchanged file: not parsed again
    ledger.released("a-0", reason="idle")
    assert cached.held() == {}
