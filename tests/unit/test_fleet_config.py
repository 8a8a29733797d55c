"""Choosing a remote provider: `[activation] provider = "ssh"` needs an inventory, whose every
worker is offered to the controller at the host's price shared among its workers (and whose
classes the catalog must know); "skypilot" offers `count` workers of each catalog class with a
SkyPilot table; `echo2 run --provider/--inventory` set the same fields; `echo2 fleet` reads the
ledger alone (states, an unknown id refused before anything stops)."""

from __future__ import annotations

import argparse
import time

import pytest

from echo2.config.activation import ActivationConfig
from echo2.config.run import RunConfig
from echo2.report.fleet_ledger import FleetLedger

CATALOG = "configs/catalog/example.toml"


def _inventory(tmp_path, worker_class: str = "rtx4090_dc") -> str:
    path = tmp_path / "hosts.toml"
    path.write_text(f"""
[defaults]
key_file = "~/.ssh/id_ed25519"
worker_class = "{worker_class}"

[[hosts]]
name = "box"
address = "10.0.0.5"
price_per_hour = 1.2
workers_per_host = 2

[[hosts]]
name = "big"
address = "10.0.0.6"
worker_class = "a100_spot"
price_per_hour = 1.6
""")
    return str(path)


def test_the_ssh_provider_needs_an_inventory_and_offers_its_workers(tmp_path):
    with pytest.raises(ValueError, match="provider \"ssh\" needs inventory"):
        ActivationConfig(provider="ssh")
    with pytest.raises(ValueError, match="no file at"):
        ActivationConfig(provider="ssh", inventory=str(tmp_path / "missing.toml"))
    cfg = RunConfig(activation={"provider": "ssh", "inventory": _inventory(tmp_path), "catalog": CATALOG})
    offered = {o.worker_id: (o.price_per_hour, o.worker_class) for o in cfg.offered_workers()}
    assert offered == {"box-0": (0.6, "rtx4090_dc"), "box-1": (0.6, "rtx4090_dc"), "big-0": (1.6, "a100_spot")}


def test_an_inventory_class_the_catalog_lacks_is_refused_naming_the_host(tmp_path):
    with pytest.raises(ValueError, match="inventory host 'box' has worker_class 'rtx9999'"):
        RunConfig(activation={"provider": "ssh", "inventory": _inventory(tmp_path, "rtx9999"), "catalog": CATALOG})


def test_the_skypilot_provider_needs_a_catalog_with_something_to_rent(tmp_path):
    with pytest.raises(ValueError, match="provider \"skypilot\" needs catalog"):
        ActivationConfig(provider="skypilot")
    with pytest.raises(ValueError, match="nothing to rent"):
        RunConfig(activation={"provider": "skypilot", "catalog": CATALOG})
    cfg = RunConfig(activation={"provider": "skypilot", "catalog": "configs/catalog/skypilot_example.toml"})
    offered = cfg.offered_workers()
    assert {o.worker_class for o in offered} >= {"g24_spot", "a100_gcp_spot"}
    assert sum(o.worker_class == "g24_spot" for o in offered) == 16  # its count
    assert all(o.worker_id.startswith(o.worker_class + "-") for o in offered)


def test_run_flags_set_the_provider_and_refuse_an_inventory_for_another(tmp_path, monkeypatch):
    import echo2.launch.local as local
    from echo2.cli import run_cmd

    seen = []
    monkeypatch.setattr(local, "run_local", lambda cfg, console: seen.append(cfg) or 0)
    inventory = _inventory(tmp_path)
    args = argparse.Namespace(config=None, overrides=[f"run_dir={str(tmp_path / 'r')!r}".replace("'", '"')],
                              provider=None, inventory=inventory)
    assert run_cmd.run(args) == 0
    assert seen[0].activation.provider == "ssh" and seen[0].activation.inventory == inventory
    refused = argparse.Namespace(config=None, overrides=[], provider="local", inventory=inventory)
    with pytest.raises(ValueError, match="use --provider ssh"):
        run_cmd.run(refused)


def test_fleet_status_states_and_down_refuses_an_unknown_id(tmp_path):
    from echo2.launch.fleet_ledger_ops import fleet_rows, release_held

    ledger = FleetLedger(tmp_path)
    ledger.acquiring("a-0", provider="ssh", machine="a", worker_class="c", price_per_hour=3600.0)
    ledger.acquiring("b-0", provider="ssh", machine="b", worker_class="c", price_per_hour=1.0)
    ledger.started("b-0", pid=5)
    ledger.acquiring("c-0", provider="ssh", machine="c", worker_class="", price_per_hour=1.0)
    ledger.released("c-0", reason="idle")
    rows = {row.worker_id: row for row in fleet_rows(tmp_path, now=time.time() + 2.0)}
    assert rows["a-0"].state.startswith("booting (") and rows["b-0"].state.startswith("starting (")
    assert rows["c-0"].state == "released"
    assert rows["a-0"].billed_usd == pytest.approx(2.0, abs=0.5)  # $1 a second, two seconds in
    with pytest.raises(ValueError, match=r"not held .*: c-0, zz \(held: a-0, b-0\)"):
        release_held(tmp_path, ["c-0", "zz"])
    assert set(FleetLedger(tmp_path).held()) == {"a-0", "b-0"}  # nothing was touched


def test_the_run_progress_shows_the_machines_still_booting():
    import io

    from rich.console import Console

    from echo2.launch.progress import RunProgress

    progress = RunProgress(RunConfig(), Console(file=io.StringIO(), width=200))
    progress.show_booting({"a-0": 12.4, "b-0": 3.0})
    assert progress.fields["booting"] == "  booting 2 (longest 12 s: a-0)"
    assert "booting 2 (longest 12 s: a-0)" in str(progress.progress.columns[3].render(progress.progress.tasks[0]))
    progress.show_booting({})
    assert progress.fields["booting"] == ""


def test_a_paced_learner_idles_in_proportion_to_its_compute():
    from echo2.learner.step import emulate_slower_learner

    started = time.perf_counter()
    emulate_slower_learner(1.0, "wall", 5.0, 5.0)  # unpaced: no idling at all
    assert time.perf_counter() - started < 0.05
    emulate_slower_learner(3.0, "wall", 0.1, 0.1)  # two more computes' worth
    assert 0.2 <= time.perf_counter() - started < 0.5


def test_a_cpu_clocked_slowdown_does_not_charge_the_time_spent_waiting_for_a_core():
    from echo2.config.worker import slowdown_idle_s

    # 0.1 s of CPU that took 0.25 s here (others held the core): 3x slower hardware lasts 0.3 s
    assert slowdown_idle_s(3.0, "cpu", wall_s=0.25, cpu_s=0.1) == pytest.approx(0.05)
    assert slowdown_idle_s(3.0, "wall", wall_s=0.25, cpu_s=0.1) == pytest.approx(0.5)  # the wait multiplied
    assert slowdown_idle_s(3.0, "cpu", wall_s=0.4, cpu_s=0.1) == 0.0  # slower than emulated: no idling
    assert slowdown_idle_s(1.0, "cpu", wall_s=0.1, cpu_s=0.1) == 0.0
