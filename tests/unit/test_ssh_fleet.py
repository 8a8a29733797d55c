"""The `ssh` fleet provider against real sshds on loopback (Debian's openssh-server): an acquire
starts the worker over SSH under its worker id and the ledger holds it with its PID; a release
stops it (checked gone on its host) and the ledger releases it; a host that cannot be used is one
line and nothing held, and the others still work; a worker the coordinator lost and whose process
is gone is released; close stops everything the ledger holds, and after the launcher is gone the
ledger alone stops what is left. The hosts' `echo2` is a stand-in that sleeps (the real install is
tests/unit/test_ssh_host.py's), so each worker is a process the test can see and kill."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import sys
import time
from pathlib import Path

import pytest
from tests.sshd import running_sshd, sshd_unavailable_reason

from echo2.config.inventory import SshHost, SshInventory
from echo2.launch.ssh_fleet import SshFleet, SshLaunch, SshTimings, stop_holding
from echo2.launch.ssh_host import Release
from echo2.report.fleet_ledger import FleetLedger
from echo2.report.metrics import MetricsWriter

TOKEN = "join-token-0123456789abcdef"
RELEASE = Release(wheel=Path("echo2-0-py3-none-any.whl"), version="test")


@pytest.fixture(scope="module")
def sshds(tmp_path_factory):
    """Two hosts: two sshds, each trusted."""
    reason = sshd_unavailable_reason()
    if reason:
        pytest.skip(reason)
    with (running_sshd(tmp_path_factory.mktemp("sshd-a")) as a, running_sshd(tmp_path_factory.mktemp("sshd-b")) as b):
        a.trust()
        b.trust()
        yield a, b


def _host(sshd, name: str, work_dir: Path, **fields) -> SshHost:
    """A host whose echo2 venv is already there: a stand-in `echo2` that sleeps."""
    base = {"name": name, "address": sshd.address, "port": sshd.port, "key_file": str(sshd.user_key),
            "known_hosts_file": str(sshd.known_hosts), "python": sys.executable, "work_dir": str(work_dir),
            "min_free_mb": 1}
    host = SshHost(**{**base, **fields})
    venv = Path(RELEASE.venv(host))
    (venv / "bin").mkdir(parents=True, exist_ok=True)
    fake = venv / "bin" / "echo2"
    fake.write_text(f"#!{sys.executable}\nimport time\ntime.sleep(300)\n")
    fake.chmod(0o755)
    (venv / ".installed").touch()
    return host


def _fleet(tmp_path: Path, hosts: list[SshHost], lines: list[str]) -> SshFleet:
    launch = SshLaunch(run_id="r1", coordinator_url="http://127.0.0.1:1", auth_token=TOKEN, release=lambda: RELEASE)
    return SshFleet(SshInventory(hosts=tuple(hosts)), launch, FleetLedger(tmp_path),
                    MetricsWriter(tmp_path / "metrics.jsonl", "launcher"), warn=lines.append,
                    timings=SshTimings(stop_grace_s=2, retry_after_s=60, check_every_s=0))


def _alive(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().split()[2]
    except FileNotFoundError:
        return False
    return state != "Z"


def _metrics(tmp_path: Path) -> list[dict]:
    return [json.loads(line) for line in (tmp_path / "metrics.jsonl").read_text().splitlines()]


@contextlib.contextmanager
def _closing(fleet: SshFleet):
    """Whatever a test finds, no worker it started outlives it (by PID, from the ledger)."""
    try:
        yield fleet
    finally:
        fleet.close(reason="test")
        for holding in fleet.ledger.holdings().values():
            pid = int(holding.details.get("pid", 0))
            if pid and _alive(pid):
                os.kill(pid, signal.SIGKILL)


def test_acquire_starts_the_worker_over_ssh_and_release_stops_it(sshds, tmp_path):
    a, _ = sshds
    host = _host(a, "gpu-a", tmp_path / "work", workers_per_host=2, price_per_hour=2.0, worker_class="a10g")
    lines: list[str] = []
    with _closing(_fleet(tmp_path, [host], lines)) as fleet:
        assert fleet.worker_ids() == {"gpu-a-0", "gpu-a-1"} == fleet.released()
        fleet.acquire("gpu-a-0")
        assert fleet.settle(60)
        held = fleet.ledger.held()
        assert set(held) == {"gpu-a-0"} and "gpu-a-0" not in fleet.released()
        holding = held["gpu-a-0"]
        assert (holding.provider, holding.machine, holding.worker_class, holding.price_per_hour) == \
            ("ssh", "gpu-a", "a10g", 1.0)  # the host's price shared by its two workers
        pid = int(holding.details["pid"])
        assert _alive(pid) and "gpu-a-0.toml" in Path(f"/proc/{pid}/cmdline").read_text()
        assert "gpu-a-0" in fleet.booting()
        fleet.observe({"role": "coordinator", "kind": "worker_registered", "worker_id": "gpu-a-0"})
        assert fleet.booting() == {}
        fleet.release("gpu-a-0")
        assert "gpu-a-0" in fleet.released()
        assert fleet.settle(60)
        assert not _alive(pid) and fleet.ledger.held() == {}
        kinds = [(r["kind"], r.get("worker_id")) for r in _metrics(tmp_path)]
        assert [k for k in kinds if k[0] in ("worker_acquired", "worker_rejoined", "worker_released")] == [
            ("worker_acquired", "gpu-a-0"), ("worker_rejoined", "gpu-a-0"), ("worker_released", "gpu-a-0")]
        assert lines == []


def test_an_unusable_host_is_one_line_and_the_others_still_start(sshds, tmp_path):
    a, b = sshds
    good = _host(a, "good", tmp_path / "good")
    refused = _host(b, "refused", tmp_path / "refused", key_file=str(b.other_key))
    lines: list[str] = []
    with _closing(_fleet(tmp_path, [good, refused], lines)) as fleet:
        fleet.acquire("refused-0")
        fleet.acquire("good-0")
        assert fleet.settle(60)
        assert set(fleet.ledger.held()) == {"good-0"}
        assert len(lines) == 1 and lines[0].startswith("host refused (") and "ssh-copy-id" in lines[0]
        assert "refused-0" in fleet.released()
        fleet.acquire("refused-0")  # within retry_after_s: not tried again
        assert fleet.settle(10) and len(lines) == 1
        failed = [r for r in _metrics(tmp_path) if r["kind"] == "worker_acquire_failed"]
        assert [(r["worker_id"], r["failure"]) for r in failed] == [("refused-0", "key_refused")]
        assert failed[0]["error"] == lines[0]


def test_a_worker_lost_and_gone_from_its_host_is_released(sshds, tmp_path):
    a, _ = sshds
    lines: list[str] = []
    with _closing(_fleet(tmp_path, [_host(a, "h", tmp_path / "work")], lines)) as fleet:
        fleet.acquire("h-0")
        assert fleet.settle(60)
        pid = int(fleet.ledger.held()["h-0"].details["pid"])
        fleet.observe({"role": "coordinator", "kind": "worker_registered", "worker_id": "h-0"})
        fleet.observe({"role": "coordinator", "kind": "worker_lost", "worker_id": "h-0"})
        assert fleet.settle(60)
        assert "h-0" not in fleet.released()  # still running: a blip, it registers again
        os.kill(pid, signal.SIGKILL)
        fleet.observe({"role": "coordinator", "kind": "worker_lost", "worker_id": "h-0"})
        assert fleet.settle(60)
        assert "h-0" in fleet.released() and fleet.ledger.held() == {}
        reasons = [json.loads(line).get("reason") for line in fleet.ledger.path.read_text().splitlines()]
        assert reasons[-1] == "lost"


def test_close_stops_what_the_ledger_holds_and_the_ledger_alone_can_too(sshds, tmp_path):
    a, b = sshds
    hosts = [_host(a, "x", tmp_path / "x", workers_per_host=2), _host(b, "y", tmp_path / "y")]
    with _closing(_fleet(tmp_path, hosts, [])) as fleet:
        for worker_id in ("x-0", "x-1", "y-0"):
            fleet.acquire(worker_id)
        assert fleet.settle(60)
        pids = {w: int(h.details["pid"]) for w, h in fleet.ledger.held().items()}
        assert set(pids) == {"x-0", "x-1", "y-0"} and all(_alive(p) for p in pids.values())
        # the launcher SIGKILLed: a fresh reader of the run dir's ledger stops y-0
        after_crash = FleetLedger(tmp_path).held()["y-0"]
        assert stop_holding(after_crash, grace_s=2) is None and not _alive(pids["y-0"])
        assert fleet.close(reason="shutdown") == []
        assert not any(_alive(p) for p in pids.values())
        assert FleetLedger(tmp_path).held() == {}
        fleet.acquire("x-0")  # a closed fleet starts nothing
        assert FleetLedger(tmp_path).held() == {}


def test_a_start_whose_pid_was_never_recorded_is_still_stopped(sshds, tmp_path):
    """The launcher died between the worker's start and the ledger's `started`: the pid file the
    start wrote beside the worker's config finds it."""
    a, _ = sshds
    with _closing(_fleet(tmp_path, [_host(a, "h", tmp_path / "work")], [])) as fleet:
        fleet.acquire("h-0")
        assert fleet.settle(60)
        holding = fleet.ledger.held()["h-0"]
        pid = int(holding.details.pop("pid"))
        assert stop_holding(holding, grace_s=2) is None
        deadline = time.monotonic() + 5
        while _alive(pid) and time.monotonic() < deadline:
            time.sleep(0.1)
        assert not _alive(pid)
