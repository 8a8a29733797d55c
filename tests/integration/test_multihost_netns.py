"""The multi-machine recipe of docs/operations.md, run literally (docs/multihost.sh) across hosts made of
network namespaces (root only): the coordinator and the learner on one host, three workers on
three others behind 100 Mbit/s tbf links, one of them refusing incoming connections as a host
behind NAT does. The run trains a few steps; weights are relayed from worker to worker, the
NAT'd worker only ever receives, and the roles' console logs say so. Every process is stopped by
PID and every namespace deleted, also on failure."""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import time
from contextlib import contextmanager
from pathlib import Path

import pytest
from tests.conftest import small_run_config
from tests.integration.runs import TOKEN, records, wait_for, write_config

from echo2.broadcast.lab.netns import HostSpec, LabNetwork, netns_unavailable_reason
from echo2.coordinator.parts.credentials import SECRET_VARIABLES

pytestmark = [pytest.mark.integration, pytest.mark.system, pytest.mark.netns]
SCRIPT = Path(__file__).resolve().parents[2] / "docs" / "multihost.sh"
LINK_BPS = 100e6
STEPS = 60  # long enough that every worker, however late it loads the model, relays and loads several versions
TRAIN_TIMEOUT_S = 240  # torch imports of five processes on a loaded 2-core box, then seconds of training


@pytest.fixture(scope="module")
def netns() -> None:
    reason = netns_unavailable_reason()
    if reason:
        pytest.skip(f"netns lab unavailable: {reason}")


@contextmanager
def _roles(lab: LabNetwork, env: dict[str, str], logs: Path):
    """Yields `start(host, step, name)`: docs/multihost.sh STEP on host `host` (THIS_HOST its
    address), its output in logs/NAME.log. `ip netns exec` and the script's `exec` keep one PID, so the role is the very
    process started; each is stopped by that PID (the others first, together, the coordinator last)."""
    started: list[subprocess.Popen] = []

    def start(host: int, step: str, name: str) -> subprocess.Popen:
        with open(logs / f"{name}.log", "ab") as log:
            proc = subprocess.Popen([*lab.exec_prefix(host), "bash", str(SCRIPT), step], stdout=log,
                                    stderr=subprocess.STDOUT, env={**env, "THIS_HOST": lab.ip(host)},
                                    start_new_session=True)
        started.append(proc)
        return proc

    try:
        yield start
    finally:
        # the coordinator (started first) last; the others together: a worker can take its
        # lease long poll (5 s) to stop, and three of them one after the other took 15 s
        for group in (started[1:], started[:1]):
            live = [proc for proc in group if proc.poll() is None]
            for proc in live:
                proc.send_signal(signal.SIGTERM)
            for proc in live:
                try:
                    proc.wait(timeout=15)
                except subprocess.TimeoutExpired:
                    proc.kill()
                    proc.wait(timeout=5)


def _env(lab: LabNetwork, config: Path, run_dir: Path) -> dict[str, str]:
    inherited = {k: v for k, v in os.environ.items() if k not in SECRET_VARIABLES}
    return {
        **inherited,
        # `echo2` as a user has it on their PATH: this interpreter's environment
        "PATH": f"{Path(sys.executable).parent}:{inherited.get('PATH', '/usr/bin:/bin')}",
        "ECHO2_AUTH_TOKEN": TOKEN, "CONFIG": str(config), "RUN_DIR": str(run_dir), "LEARNER_HOST": lab.ip(0),
        "BANDWIDTH_BPS": f"{LINK_BPS:g}",
    }


def _step(lab, env, host: int, step: str, timeout_s: float) -> subprocess.CompletedProcess:
    return _steps(lab, env, [host], step, timeout_s)[host]


def _steps(lab, env, hosts: list[int], step: str, timeout_s: float) -> dict[int, subprocess.CompletedProcess]:
    """docs/multihost.sh STEP on each host at once, run to completion."""
    procs = {host: subprocess.Popen([*lab.exec_prefix(host), "bash", str(SCRIPT), step],
                                    env={**env, "THIS_HOST": lab.ip(host)}, stdout=subprocess.PIPE,
                                    stderr=subprocess.PIPE, text=True) for host in hosts}
    done = {}
    try:
        for host, proc in procs.items():
            out, err = proc.communicate(timeout=timeout_s)
            done[host] = subprocess.CompletedProcess(proc.args, proc.returncode, out, err)
    finally:
        for proc in procs.values():
            if proc.poll() is None:
                proc.kill()
                proc.wait(timeout=5)
    return done


def test_the_readme_recipe_across_four_hosts(netns, tmp_path):
    assert (Path(sys.executable).parent / "echo2").is_file(), "the echo2 command is not installed beside python"
    run_dir = tmp_path / "my-run"
    # the tiny model publishes several versions a second, faster than a worker on a busy 2-core box
    # gets one through a 100 Mbit/s link, so the origin keeps the last 8 (a 1-2 s window) rather
    # than 2: a late worker that reaches it is never told its version is gone (real runs publish
    # every few seconds to minutes)
    cfg = small_run_config(run_dir, coordinator={"auth_token": ""}, learner={"upload_bps": LINK_BPS},
                           broadcast={"keep_versions": 8},
                           train={"steps": STEPS, "checkpoint_every": 100, "eval_every": 100})
    config = write_config(tmp_path / "my.toml", cfg)
    logs = tmp_path / "logs"
    logs.mkdir()
    hosts = [HostSpec("learner", LINK_BPS, LINK_BPS), HostSpec("a", LINK_BPS, LINK_BPS),
             HostSpec("b", LINK_BPS, LINK_BPS), HostSpec("nat", LINK_BPS, LINK_BPS, accepts_incoming=False)]
    with LabNetwork(hosts, prefix="e2mh") as lab, _roles(lab, _env(lab, config, run_dir), logs) as start:
        env = _env(lab, config, run_dir)
        prepared = _step(lab, env, 0, "prepare", timeout_s=300)
        assert prepared.returncode == 0, prepared.stderr[-3000:]
        coordinator = start(0, "coordinator", "coordinator")
        wait_for(lambda: (run_dir / "coordinator.json").is_file(), 120, "the coordinator to listen", alive=coordinator)
        checks = _steps(lab, env, [1, 3], "check", timeout_s=120)
        for host, name, step in ((1, "worker-a", "worker"), (2, "worker-b", "worker"),
                                 (3, "worker-nat", "worker-behind-nat")):
            start(host, step, name)
        # the learner once finished 30 steps before slow-starting workers (two cores
        # importing torch three times over) had loaded the model: it starts once all three have
        # joined and loaded it, as an operator would wait for the fleet before training
        wait_for(lambda: (logs / "coordinator.log").read_text(errors="replace").count(" joined from ") >= 3
                 and all("waiting for a policy version" in (logs / f"{name}.log").read_text(errors="replace")
                         for name in ("worker-a", "worker-b", "worker-nat")),
                 240, "three workers to join and load the model", alive=coordinator)
        learner = start(0, "learner", "learner")
        try:
            assert learner.wait(timeout=TRAIN_TIMEOUT_S) == 0
        except (AssertionError, subprocess.TimeoutExpired):
            pytest.fail("the learner did not finish:\n" + "\n".join(
                f"--- {log.name}\n{log.read_text(errors='replace')[-2500:]}" for log in sorted(logs.iterdir())))
        time.sleep(1.0)  # the workers' last loads, logged

    _assert_checks(checks)
    assert [r["step"] for r in records(run_dir, "train_step")] == list(range(STEPS))
    text = {log.stem: log.read_text(errors="replace") for log in logs.iterdir()}
    ids = {name: _registered_id(text[name]) for name in ("worker-a", "worker-b", "worker-nat")}
    loads = {name: _loads(text[name]) for name in ids}
    # weights went from worker to worker while the learner trained: versions it published before
    # its last reached workers from a peer, not from the learner
    relayed = {(version, source) for name in ids for version, sources in loads[name] for source in sources
               if source != "origin" and version < STEPS}
    assert {source for _, source in relayed} & {ids["worker-a"], ids["worker-b"]}, loads
    # the NAT'd worker was only a leaf: nobody got a byte from it
    assert ids["worker-nat"] not in {s for name in ids for _, sources in loads[name] for s in sources}, loads
    assert "a broadcast leaf (accepts_incoming=false: no relay)" in text["worker-nat"]
    # the logs say who joined and which versions were loaded
    for name, worker_id in ids.items():
        assert f"worker {worker_id} joined from 10.77.0." in text["coordinator"]
        assert "contacting the coordinator at http://10.77.0.2:8470" in text[name]
        assert re.search(r"loaded version \d+: [0-9.]+ MB fetched in", text[name]), text[name][-2000:]
    assert f"worker {ids['worker-nat']} joined from {lab.ip(3)} (engine hf, $0/h, relay none: a broadcast leaf)" \
        in text["coordinator"]
    assert re.search(rf"version {STEPS} published: broadcast pipelined", text["coordinator"])
    assert f"step {STEPS}/{STEPS}: waited" in text["learner"]
    assert "listening on 0.0.0.0:8470 (http)" in text["coordinator"]


def _assert_checks(checks: dict[int, subprocess.CompletedProcess]) -> None:
    reachable, nat = checks[1], checks[3]
    assert reachable.returncode == 0, reachable.stdout + reachable.stderr
    assert [line.split()[:2] for line in reachable.stdout.splitlines()] == \
        [["ok", "reach"], ["ok", "protocol"], ["ok", "auth"], ["ok", "relay"]]
    assert nat.returncode == 1
    lines = dict((line.split()[1], line) for line in nat.stdout.splitlines())
    assert lines["auth"].startswith("ok")
    assert lines["relay"].startswith("failed") and "only be a broadcast leaf" in lines["relay"], nat.stdout


def _registered_id(log: str) -> str:
    match = re.search(r"registered as worker (\S+) ", log)
    assert match, log[-2000:]
    return match.group(1)


def _loads(log: str) -> list[tuple[int, set[str]]]:
    """(version, the sources it came from) of every version load a worker logged."""
    return [(int(version), {part.split()[0] for part in listed.split(", ")})
            for version, listed in re.findall(r"loaded version (\d+): .*? fetched in [0-9.]+ s \(from ([^)]*)\)", log)]
