"""`echo2 run --provider ssh --inventory hosts.toml` against real sshds on loopback: the run's
exact echo2 is shipped to each host and installed once, every worker is started over SSH under its
inventory id and trains, a host whose key is refused is one line and the run goes on without it,
an idle worker is released over SSH (its process gone), the join token is on no command line,
and when the run ends the ledger holds nothing and no worker runs. (The network-namespace
version with shaped links, a killed host and `echo2 fleet down` after a SIGKILL is the system
tier's test_ssh_fleet_netns.py.)"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest
from tests.conftest import small_run_config
from tests.integration.runs import TOKEN, processes, records, to_toml, wait_for, write_config
from tests.sshd import running_sshd, sshd_unavailable_reason

from echo2.report.fleet_ledger import FleetLedger

pytestmark = [pytest.mark.integration, pytest.mark.system]


@pytest.fixture(scope="module")
def sshds(tmp_path_factory):
    reason = sshd_unavailable_reason()
    if reason:
        pytest.skip(reason)
    with (running_sshd(tmp_path_factory.mktemp("sshd-a")) as a, running_sshd(tmp_path_factory.mktemp("sshd-b")) as b):
        a.trust()
        b.trust()
        yield a, b


def host_entry(sshd, name: str, work_dir: Path, **fields) -> dict:
    """An inventory host on `sshd` whose Python is this one (its packages: torch and the rest)."""
    return {"name": name, "address": sshd.address, "port": sshd.port, "key_file": str(sshd.user_key),
            "known_hosts_file": str(sshd.known_hosts), "python": sys.executable, "work_dir": str(work_dir),
            "min_free_mb": 1, **fields}


def pid_alive(pid: int) -> bool:
    try:
        return Path(f"/proc/{pid}/stat").read_text().split()[2] != "Z"
    except FileNotFoundError:
        return False


def token_on_a_command_line(token: str) -> list[int]:
    found = []
    for proc in Path("/proc").iterdir():
        if proc.name.isdigit():
            try:
                if token.encode() in (proc / "cmdline").read_bytes():
                    found.append(int(proc.name))
            except (FileNotFoundError, ProcessLookupError, PermissionError):
                pass
    return found


def pid_released(run_dir: Path, released: dict) -> int:
    """The PID of the worker a `worker_released` record stopped (its acquire's; the worker may
    have been acquired again since)."""
    acquired = [r for r in _launcher(run_dir, "worker_acquired")
                if r["worker_id"] == released["worker_id"] and r["time"] <= released["time"]]
    return int(acquired[-1]["pid"])


def _launcher(run_dir: Path, kind: str) -> list[dict]:
    return [r for r in records(run_dir, kind) if r["role"] == "launcher"]


def test_a_run_over_ssh_starts_releases_and_cleans_up(sshds, tmp_path):
    a, b = sshds
    inventory = tmp_path / "hosts.toml"
    hosts = [host_entry(a, "cheap", tmp_path / "cheap", price_per_hour=2.0, workers_per_host=2),
             host_entry(b, "dear", tmp_path / "dear", price_per_hour=8.0),
             host_entry(b, "refused", tmp_path / "refused", key_file=str(b.other_key), address="localhost",
                        known_hosts="accept-new")]
    inventory.write_text(to_toml({"hosts": hosts}))
    cfg = small_run_config(
        tmp_path / "ssh-run", train={"steps": 2000, "max_staleness": 2},  # stopped by the test
        coordinator={"heartbeat_interval_s": 0.3, "worker_timeout_s": 3.0},
        activation={"control_period_s": 0.5, "min_samples": 2, "headroom": 1.0, "scale_down_after_s": 1.0,
                    "release_after_s": 1.0},
    )
    config = write_config(tmp_path / "run.toml", cfg)
    run_dir, log = cfg.run_path, tmp_path / "run.log"
    with processes() as start:
        proc = start(["run", "--config", str(config), "--provider", "ssh", "--inventory", str(inventory)], log)
        acquired = wait_for(lambda: len({r["worker_id"] for r in _launcher(run_dir, "worker_acquired")}) == 3, 240,
                            "the three workers of the good hosts to start over SSH", alive=proc)
        assert acquired
        wait_for(lambda: len({r["worker_id"] for r in records(run_dir, "worker_registered")}) >= 3, 120,
                 "them to register", alive=proc)
        assert token_on_a_command_line(TOKEN) == []
        released = wait_for(lambda: [r for r in _launcher(run_dir, "worker_released") if r.get("provider") == "ssh"],
                            180, "an idle worker released over SSH", alive=proc)[0]
        assert not pid_alive(pid_released(run_dir, released))
        proc.terminate()
        assert proc.wait(timeout=120) in (0, 130)
    text = log.read_text()
    assert "host refused (root@localhost" in text and "ssh-copy-id" in text, text[-3000:]
    failed = [r for r in _launcher(run_dir, "worker_acquire_failed") if r["worker_id"] == "refused-0"]
    assert failed and failed[0]["failure"] == "key_refused"
    assert last_step_trained(run_dir) >= 1
    ledger = FleetLedger(run_dir)
    assert ledger.held() == {}  # every worker stopped at the end, checked gone
    for holding in ledger.holdings().values():
        if "pid" in holding.details:
            assert not pid_alive(int(holding.details["pid"])), holding
    assert {r["worker_id"] for r in records(run_dir, "worker_registered")} == {"cheap-0", "cheap-1", "dear-0"}
    installs = list((tmp_path / "cheap" / "venvs").iterdir())
    assert len(installs) == 1 and (installs[0] / ".installed").is_file()  # one venv for the host's two workers
    assert json.loads((run_dir / "config.json").read_text())["activation"]["provider"] == "ssh"


def last_step_trained(run_dir: Path) -> int:
    return max((r["step"] for r in records(run_dir, "train_step")), default=-1)


def test_after_a_sigkill_of_the_launcher_fleet_down_stops_every_worker(sshds, tmp_path):
    import os
    import signal
    import subprocess

    a, b = sshds
    inventory = tmp_path / "hosts.toml"
    inventory.write_text(to_toml({"hosts": [host_entry(a, "x", tmp_path / "x", workers_per_host=2),
                                            host_entry(b, "y", tmp_path / "y")]}))
    cfg = small_run_config(tmp_path / "killed", train={"steps": 2000, "max_staleness": 2},
                           activation={"release_after_s": 600.0})
    config = write_config(tmp_path / "run.toml", cfg)
    run_dir = cfg.run_path
    with processes() as start:
        proc = start(["run", "--config", str(config), "--provider", "ssh", "--inventory", str(inventory)],
                     tmp_path / "run.log")
        wait_for(lambda: len({r["worker_id"] for r in _launcher(run_dir, "worker_acquired")}) == 3, 240,
                 "three workers started over SSH", alive=proc)
        pids = {w: int(h.details["pid"]) for w, h in FleetLedger(run_dir).held().items()}
        proc.send_signal(signal.SIGKILL)
        proc.wait(timeout=10)
        for pid in json.loads((run_dir / "pids.json").read_text()).values():  # its coordinator and learner
            if pid_alive(pid):
                os.kill(pid, signal.SIGKILL)
        assert all(pid_alive(pid) for pid in pids.values())  # nobody stopped the workers
        down = subprocess.run([sys.executable, "-m", "echo2", "fleet", "down", "--all", "--run-dir", str(run_dir)],
                              capture_output=True, text=True, timeout=120)
        assert down.returncode == 0, down.stdout + down.stderr
    assert not any(pid_alive(pid) for pid in pids.values())
    assert FleetLedger(run_dir).held() == {}
    status = subprocess.run([sys.executable, "-m", "echo2", "fleet", "status", "--run-dir", str(run_dir)],
                            capture_output=True, text=True, timeout=60)
    assert status.returncode == 0 and "0 held, 3 released" in status.stdout, status.stdout


def test_fleet_up_beside_a_coordinator_started_by_hand_runs_and_releases_the_fleet(sshds, tmp_path):
    """The multi-machine recipe with the ssh provider: `echo2 prepare`, `echo2 coordinator` and
    `echo2 learner` by hand, and `echo2 fleet up` beside them starting the inventory's workers
    and, once the learner is done, stopping every one."""
    a, _ = sshds
    inventory = tmp_path / "hosts.toml"
    inventory.write_text(to_toml({"hosts": [host_entry(a, "box", tmp_path / "box", workers_per_host=2)]}))
    cfg = small_run_config(tmp_path / "by-hand", train={"steps": 30, "max_staleness": 2},
                           activation={"provider": "ssh", "inventory": str(inventory)})
    config = write_config(tmp_path / "run.toml", cfg)
    run_dir = str(cfg.run_path)
    with processes() as start:
        prepared = start(["prepare", "--config", str(config)], tmp_path / "prepare.log")
        assert prepared.wait(timeout=300) == 0, (tmp_path / "prepare.log").read_text()[-2000:]
        coordinator = start(["coordinator", "--run-dir", run_dir], tmp_path / "coordinator.log")
        wait_for(lambda: (cfg.run_path / "coordinator.json").is_file(), 60, "the coordinator", alive=coordinator)
        fleet = start(["fleet", "up", "--run-dir", run_dir], tmp_path / "fleet.log")
        learner = start(["learner", "--run-dir", run_dir], tmp_path / "learner.log")
        assert learner.wait(timeout=240) == 0, (tmp_path / "learner.log").read_text()[-2000:]
        assert fleet.wait(timeout=120) == 0, (tmp_path / "fleet.log").read_text()[-2000:]
    assert "the learner is done: releasing the fleet" in (tmp_path / "fleet.log").read_text()
    holdings = FleetLedger(cfg.run_path).holdings()
    assert set(holdings) == {"box-0", "box-1"} and FleetLedger(cfg.run_path).held() == {}
    assert not any(pid_alive(int(h.details["pid"])) for h in holdings.values())
