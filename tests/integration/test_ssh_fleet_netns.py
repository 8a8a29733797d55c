"""The ssh fleet across hosts made of network namespaces (root only), each running Debian's sshd
on its own shaped link: `echo2 run --provider ssh` on the learner's host trains the tiny model
with online activation over four good hosts in two classes (price and pace apart); every worker
is started over SSH, an idle one is released over SSH (its process gone) and acquired again on
demand when one host's sshd and worker are killed mid-run (its leases requeue: no prompt lost or
trained twice). Three bad hosts (a refused key, no python3, an address nobody answers) are one
line each and the run goes on; the join token is on no command line. Then a second run is
SIGKILLed with its coordinator, and `echo2 fleet down --all` leaves no worker running. Every
process is stopped by PID and every namespace deleted, also on failure."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from tests.conftest import small_run_config
from tests.integration.runs import LEARNER_TOKEN, OPERATOR_TOKEN, TOKEN, records, to_toml, wait_for, write_config
from tests.integration.test_ssh_run import host_entry, pid_alive, pid_released, token_on_a_command_line
from tests.reliability.accounting import accounting
from tests.sshd import running_sshd, sshd_unavailable_reason

from echo2.broadcast.lab.netns import HostSpec, LabNetwork, netns_unavailable_reason
from echo2.report.fleet_ledger import FleetLedger

pytestmark = [pytest.mark.integration, pytest.mark.system, pytest.mark.netns]
PORT = 8470
FAST_BPS, SLOW_BPS = 100e6, 20e6
GOOD = {1: ("fast-a", "fast"), 2: ("fast-b", "fast"), 3: ("slow-a", "slow"), 4: ("slow-b", "slow")}
CLASS = {"fast": {"price_per_hour": 2.0, "worker": {"slowdown": 1.0, "bandwidth_bps": FAST_BPS}},
         "slow": {"price_per_hour": 0.5, "worker": {"slowdown": 3.0, "bandwidth_bps": SLOW_BPS}}}


@pytest.fixture(scope="module")
def lab(tmp_path_factory):
    """The learner's host (0), four good hosts (1-4) and two bad ones (5: its key refused, 6: no
    python3), each with its own sshd, its host key trusted."""
    reason = netns_unavailable_reason() or sshd_unavailable_reason()
    if reason:
        pytest.skip(reason)
    specs = [HostSpec("learner", FAST_BPS, FAST_BPS)]
    specs += [HostSpec(name, *(2 * ((FAST_BPS,) if cls == "fast" else (SLOW_BPS,)))) for name, cls in GOOD.values()]
    specs += [HostSpec("badkey", FAST_BPS, FAST_BPS), HostSpec("nopython", FAST_BPS, FAST_BPS)]
    root = tmp_path_factory.mktemp("hosts")
    with LabNetwork(specs, prefix="e2ssh") as network, contextlib.ExitStack() as stack:
        sshds = {i: stack.enter_context(running_sshd(root / f"sshd{i}", address=network.ip(i),
                                                     exec_prefix=network.exec_prefix(i)))
                 for i in range(1, len(specs))}
        for sshd in sshds.values():
            sshd.trust()
        yield network, sshds, root


def _inventory(lab, path: Path, hosts: list[int], *, bad: bool) -> Path:
    network, sshds, root = lab
    entries = []
    for i in hosts:
        name, cls = GOOD[i]
        entries.append(host_entry(sshds[i], name, root / name, worker_class=cls, **CLASS[cls]))
    if bad:
        entries.append(host_entry(sshds[5], "badkey", root / "badkey", key_file=str(sshds[5].other_key)))
        entries.append(host_entry(sshds[6], "nopython", root / "nopython", python="/nonexistent/python3"))
        entries.append(host_entry(sshds[1], "gone", root / "gone", address="10.77.0.200"))  # nobody there
    path.write_text(to_toml({"hosts": entries}))
    return path


def _config(network, tmp_path: Path, name: str, **activation):
    cfg = small_run_config(
        tmp_path / name, train={"steps": 100_000, "max_staleness": 2},  # ended by the test once it has seen enough
        coordinator={"host": "0.0.0.0", "port": PORT, "heartbeat_interval_s": 0.3, "worker_timeout_s": 3.0},
        learner={"host": "0.0.0.0", "advertise_host": network.ip(0), "upload_bps": FAST_BPS},
        broadcast={"keep_versions": 8},
        activation={"control_period_s": 0.5, "min_samples": 2, "headroom": 1.0, "scale_down_after_s": 1.0,
                    "release_after_s": 2.0, "coordinator_url": f"http://{network.ip(0)}:{PORT}", **activation},
    )
    return cfg, write_config(tmp_path / f"{name}.toml", cfg)


@contextlib.contextmanager
def _launcher(network, config: Path, inventory: Path, log: Path):
    """`echo2 run --provider ssh` on the learner's host; SIGTERM (then SIGKILL) on the way out."""
    env = {**os.environ, "ECHO2_AUTH_TOKEN": TOKEN, "ECHO2_LEARNER_TOKEN": LEARNER_TOKEN,
           "ECHO2_OPERATOR_TOKEN": OPERATOR_TOKEN}
    with open(log, "ab") as handle:
        proc = subprocess.Popen([*network.exec_prefix(0), sys.executable, "-m", "echo2", "run", "--config",
                                 str(config), "--provider", "ssh", "--inventory", str(inventory)],
                                stdout=handle, stderr=subprocess.STDOUT, env=env, start_new_session=True)
    try:
        yield proc
    finally:
        if proc.poll() is None:
            proc.send_signal(signal.SIGTERM)
            try:
                proc.wait(timeout=120)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait(timeout=10)


def _launched(run_dir: Path, kind: str) -> list[dict]:
    return [r for r in records(run_dir, kind) if r["role"] == "launcher" and r.get("provider", "ssh") == "ssh"]


def _kill_everything_left(run_dir: Path) -> None:
    """Whatever the test found: no worker, coordinator or learner of this run outlives it."""
    pids = json.loads((run_dir / "pids.json").read_text()).values() if (run_dir / "pids.json").is_file() else []
    held = [int(h.details.get("pid", 0)) for h in FleetLedger(run_dir).holdings().values()]
    for pid in [*pids, *held]:
        if pid and pid_alive(pid):
            os.kill(pid, signal.SIGKILL)


def test_an_ssh_fleet_across_shaped_hosts_releases_reacquires_and_survives_a_dead_host(lab, tmp_path):
    network, sshds, _ = lab
    inventory = _inventory(lab, tmp_path / "hosts.toml", list(GOOD), bad=True)
    cfg, config = _config(network, tmp_path, "fleet", provider="ssh", inventory=str(inventory))
    run_dir, log = cfg.run_path, tmp_path / "run.log"
    try:
        with _launcher(network, config, inventory, log) as proc:
            wait_for(lambda: len({r["worker_id"] for r in _launched(run_dir, "worker_acquired")}) == 4, 300,
                     "the four good hosts' workers started over SSH", alive=proc)
            wait_for(lambda: {r["worker_id"] for r in records(run_dir, "worker_registered")} >= {
                f"{name}-0" for name, _ in GOOD.values()}, 240, "them to register", alive=proc)
            assert token_on_a_command_line(TOKEN) == []
            released = wait_for(lambda: _launched(run_dir, "worker_released"), 240, "an idle worker released",
                                alive=proc)[0]
            assert not pid_alive(pid_released(run_dir, released))
            victims, again = _kill_until_replaced(run_dir, sshds, proc)
            wait_for(lambda: [r for r in _launched(run_dir, "worker_rejoined") if r["worker_id"] == again["worker_id"]
                              and r["time"] >= again["time"]], 120, "the replacement to register", alive=proc)
            step_then = max(r["step"] for r in records(run_dir, "train_step"))
            wait_for(lambda: max(r["step"] for r in records(run_dir, "train_step")) >= step_then + 10, 180,
                     "ten more steps with the replacement", alive=proc)
            proc.send_signal(signal.SIGTERM)
            assert proc.wait(timeout=120) in (0, 130)
        text = log.read_text(errors="replace")
        for line in ("host badkey (", "host nopython (", "host gone ("):
            assert line in text, text[-4000:]
        assert "ssh-copy-id" in text and "no /nonexistent/python3 there" in text and "unreachable" in text
        books = accounting(run_dir, max_staleness=2)
        assert books["rollouts_lost"] == 0 and books["duplicates"] == 0, books
        assert books["max_staleness"] <= 2 and books["steps_trained"] >= 10, books
        held = FleetLedger(run_dir).held()
        assert set(held) <= set(victims), held  # only dead hosts' workers: their stop could not be checked
        for holding in FleetLedger(run_dir).holdings().values():
            if holding.worker_id not in victims and "pid" in holding.details:
                assert not pid_alive(int(holding.details["pid"])), holding
    finally:
        _kill_everything_left(run_dir)


def _kill_until_replaced(run_dir: Path, sshds: dict, proc) -> tuple[list[str], dict]:
    """Kill the host of a running worker while a good worker is released (so there is one to
    acquire in its place); while the rest still cover the demand (the controller needs no
    replacement), kill the next one. Returns the dead hosts' workers and the acquire of a
    released worker that replaced them. The controller may choose the released
    worker again just before a kill, so an acquire counts from the moment it was seen released."""
    victims: list[str] = []
    while len(victims) < len(GOOD) - 1:
        seen_released_at = time.time()
        wait_for(lambda: _good_released(run_dir) and _running_hosts(run_dir, sshds, victims), 240,
                 "a good worker released beside a running one", alive=proc)
        victims.append(_kill_a_running_host(run_dir, sshds))
        with contextlib.suppress(AssertionError):
            again = wait_for(lambda since=seen_released_at: [r for r in _launched(run_dir, "worker_acquired")
                                                              if r["time"] > since and r["worker_id"] not in victims],
                             60, "a released worker acquired again to replace the dead host", alive=proc)[0]
            return victims, again
        assert proc.poll() is None, "the run ended while hosts were being killed"
    raise AssertionError(f"no replacement acquired after killing the hosts of {victims}")


def _good_released(run_dir: Path) -> set[str]:
    return {f"{name}-0" for name, _ in GOOD.values()} - set(FleetLedger(run_dir).held())


def _running_hosts(run_dir: Path, sshds: dict, victims: list[str]) -> list[str]:
    """Good workers held with a PID whose host's sshd is alive."""
    index_of = {f"{name}-0": i for i, (name, _) in GOOD.items()}
    held = FleetLedger(run_dir).held()
    return [w for w in sorted(held) if w in index_of and w not in victims and "pid" in held[w].details
            and pid_alive(sshds[index_of[w]].pid)]


def _kill_a_running_host(run_dir: Path, sshds: dict) -> str:
    """SIGKILL the sshd and the worker of a host whose worker runs now; returns the worker id."""
    index_of = {f"{name}-0": i for i, (name, _) in GOOD.items()}
    victim = _running_hosts(run_dir, sshds, [])[0]
    os.kill(sshds[index_of[victim]].pid, signal.SIGKILL)
    os.kill(int(FleetLedger(run_dir).held()[victim].details["pid"]), signal.SIGKILL)
    return victim


def test_after_a_sigkill_of_launcher_and_coordinator_fleet_down_leaves_no_worker(lab, tmp_path):
    network, sshds, _ = lab
    alive = [i for i in GOOD if pid_alive(sshds[i].pid)]  # the other test killed some hosts' sshd
    inventory = _inventory(lab, tmp_path / "hosts.toml", alive, bad=False)
    cfg, config = _config(network, tmp_path, "killed", provider="ssh", inventory=str(inventory),
                          release_after_s=600.0)
    run_dir = cfg.run_path
    try:
        with _launcher(network, config, inventory, tmp_path / "run.log") as proc:
            wait_for(lambda: len({r["worker_id"] for r in _launched(run_dir, "worker_acquired")}) == len(alive), 300,
                     "every live host's worker started over SSH", alive=proc)
            workers = [int(h.details["pid"]) for h in FleetLedger(run_dir).held().values()]
            proc.kill()
            proc.wait(timeout=10)
            for pid in json.loads((run_dir / "pids.json").read_text()).values():  # the coordinator, the learner
                if pid_alive(pid):
                    os.kill(pid, signal.SIGKILL)
        assert all(pid_alive(pid) for pid in workers)  # nobody stopped them
        down = subprocess.run([*network.exec_prefix(0), sys.executable, "-m", "echo2", "fleet", "down", "--all",
                               "--run-dir", str(run_dir)], capture_output=True, text=True, timeout=180)
        assert down.returncode == 0, down.stdout + down.stderr
        assert not any(pid_alive(pid) for pid in workers)
        assert FleetLedger(run_dir).held() == {}
    finally:
        _kill_everything_left(run_dir)
