"""The `ssh` provider's host steps against a real sshd on loopback (Debian's openssh-server),
through the OpenSSH client: each way a host can be unusable is one line naming the host and the
fix (an unknown host key, a refused key, a closed port, no Python), and a worker started over SSH
keeps the join token off every command line, in a file only its user reads, and is stopped by
its PID and checked gone. An inventory with a duplicate host or an unknown class is refused
before anything starts."""

from __future__ import annotations

import contextlib
import os
import signal
import stat
import sys
import time
from pathlib import Path

import pytest
from tests.sshd import free_port, running_sshd, sshd_unavailable_reason

from echo2.config.inventory import SshHost, load_inventory
from echo2.config.worker import WorkerConfig
from echo2.launch.ssh_client import SshClient, SshFailure
from echo2.launch.ssh_host import config_marker, script, stop_worker, worker_running, worker_toml

TOKEN = "join-token-0123456789abcdef"


@pytest.fixture(scope="module")
def sshd(tmp_path_factory):
    reason = sshd_unavailable_reason()
    if reason:
        pytest.skip(reason)
    with running_sshd(tmp_path_factory.mktemp("sshd")) as server:
        yield server


def _host(sshd, **fields) -> SshHost:
    base = {"name": "h1", "address": sshd.address, "port": sshd.port, "key_file": str(sshd.user_key),
            "known_hosts_file": str(sshd.known_hosts), "python": sys.executable}
    return SshHost(**{**base, **fields})


def _failure(host: SshHost, command: str = "true") -> SshFailure:
    with pytest.raises(SshFailure) as caught:
        SshClient(host).run(command, timeout_s=30)
    return caught.value


def test_each_unusable_host_is_one_line_with_the_host_and_the_fix(sshd, tmp_path):
    sshd.known_hosts.write_text("")
    unknown = _failure(_host(sshd))
    assert unknown.kind == "host_key" and "host h1" in str(unknown) and "ssh-keyscan" in str(unknown)
    sshd.trust()
    refused = _failure(_host(sshd, key_file=str(sshd.other_key)))
    assert refused.kind == "key_refused" and "authorized_keys" in str(refused)
    closed = _failure(_host(sshd, port=free_port()))
    assert closed.kind == "unreachable" and "check the address and port" in str(closed)
    missing = _failure(_host(sshd, key_file=str(tmp_path / "nokey")))
    assert missing.kind == "key_missing"
    assert all("\n" not in str(f) for f in (unknown, refused, closed, missing))


def test_accept_new_trusts_a_host_on_first_use(sshd, tmp_path):
    known = tmp_path / "known_hosts"
    result = SshClient(_host(sshd, known_hosts="accept-new", known_hosts_file=str(known))).run("echo hi", timeout_s=30)
    assert result.stdout.strip() == "hi" and known.read_text().strip()  # recorded (hashed or not)


def test_a_host_without_python_says_so(sshd):
    from echo2.launch.ssh_host import Release, ensure_installed

    sshd.trust()
    host = _host(sshd, python="/nonexistent/python3")
    with pytest.raises(SshFailure) as caught:
        ensure_installed(SshClient(host), Release(Path("/nonexistent.whl"), "0"))
    assert caught.value.kind == "no_python" and "Python 3.11" in str(caught.value)


def test_a_worker_started_over_ssh_keeps_its_token_off_command_lines_and_is_stopped(sshd, tmp_path):
    """The start script itself (the venv is this interpreter's: a stand-in `echo2` that sleeps)."""
    from echo2.launch.ssh_host import start_worker

    sshd.trust()
    host = _host(sshd, work_dir=str(tmp_path / "work"))
    venv = tmp_path / "venv"
    (venv / "bin").mkdir(parents=True)
    fake = venv / "bin" / "echo2"
    fake.write_text(f"#!{sys.executable}\nimport time\ntime.sleep(300)\n")
    fake.chmod(0o755)
    worker = WorkerConfig(worker_id="h1-0", price_per_hour=0.5)
    client = SshClient(host)
    pid = start_worker(client, venv=str(venv), run_id="r1", worker=worker, token=TOKEN,
                       coordinator_url="http://127.0.0.1:1")
    try:
        _check_started_worker(client, host, pid)
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)  # whatever the test found, nothing it started outlives it


def _check_started_worker(client: SshClient, host: SshHost, pid: int) -> None:
    marker = config_marker(host, "r1", "h1-0")
    assert worker_running(client, pid=pid, marker=marker)
    config = Path(marker)
    assert stat.S_IMODE(config.stat().st_mode) == 0o600 and TOKEN in config.read_text()
    for proc in Path("/proc").iterdir():  # every process's command line, the worker's among them
        if proc.name.isdigit():
            try:
                assert TOKEN.encode() not in (proc / "cmdline").read_bytes()
            except (FileNotFoundError, ProcessLookupError, PermissionError):
                pass
    assert stop_worker(client, pid=pid, marker=marker, grace_s=2) == "stopped"
    assert not worker_running(client, pid=pid, marker=marker)
    assert stop_worker(client, pid=pid, marker=marker, grace_s=2) == "gone"


def test_a_pid_reused_by_another_process_is_never_signalled(sshd, tmp_path):
    import subprocess

    sshd.trust()
    other = subprocess.Popen(["sleep", "60"], start_new_session=True)
    try:
        client = SshClient(_host(sshd))
        assert stop_worker(client, pid=other.pid, marker=str(tmp_path / "h1-0.toml"), grace_s=1) == "gone"
        time.sleep(0.2)
        assert other.poll() is None
    finally:
        other.kill()
        other.wait(timeout=10)


def test_the_worker_file_is_a_valid_worker_config_with_the_token():
    import tomllib

    from echo2.config.base import validate

    worker = WorkerConfig(worker_id="h1-0", worker_class="l4", price_per_hour=0.7, relay_host="0.0.0.0")
    data = tomllib.loads(worker_toml(worker, TOKEN).decode())
    assert validate(WorkerConfig, data) == worker.model_copy(update={"auth_token": TOKEN})


def test_script_arguments_are_quoted_not_spliced():
    assert script("echo \"$1\"", "a b; rm -rf /") == "sh -c 'echo \"$1\"' sh 'a b; rm -rf /'"


def test_an_inventory_with_a_duplicate_host_or_an_unknown_class_is_refused(tmp_path):
    path = tmp_path / "hosts.toml"
    head = '[defaults]\nuser = "gpu"\nprice_per_hour = 0.5\n'
    a = '[[hosts]]\nname = "a"\naddress = "10.0.0.1"\nworker_class = "l4"\nworkers_per_host = 2\n'
    path.write_text(head + a + '[[hosts]]\nname = "b"\naddress = "10.0.0.1"\n')
    with pytest.raises(ValueError, match="10.0.0.1:22, as host 'a' is"):
        load_inventory(path)
    path.write_text(head + a + '[[hosts]]\nname = "a"\naddress = "10.0.0.2"\n')
    with pytest.raises(ValueError, match="name 'a' is also hosts"):
        load_inventory(path)
    path.write_text(head + a + '[[hosts]]\nname = "b"\naddress = "10.0.0.2"\n')
    inventory = load_inventory(path)
    assert inventory.worker_ids() == ["a-0", "a-1", "b-0"] and inventory.hosts[0].user == "gpu"
    assert inventory.host_of("a-1").worker_config("a-1").price_per_hour == 0.25  # the host's price, shared
    with pytest.raises(ValueError, match="worker_class 'l4', which the activation catalog"):
        inventory.check_classes({"a100_spot"}, "example.toml")


def test_a_bad_worker_setting_in_the_inventory_names_the_host(tmp_path):
    path = tmp_path / "hosts.toml"
    path.write_text('[[hosts]]\nname = "a"\naddress = "10.0.0.1"\n[hosts.worker]\nengine = "nope"\n')
    with pytest.raises(ValueError, match="inventory host 'a' worker settings"):
        load_inventory(path)


def test_a_fresh_host_gets_this_echo2_once_in_a_venv_that_sees_its_python(sshd, tmp_path):
    """ensure_installed on a host whose Python has echo2's dependencies (this interpreter's):
    the wheel is shipped and installed, its `echo2` runs, and a second acquire reuses the venv."""
    from echo2.launch.ssh_host import Release, ensure_installed, install_step
    from echo2.launch.wheel import coordinator_release

    sshd.trust()
    host = _host(sshd, work_dir=str(tmp_path / "work"), min_free_mb=1)
    release = coordinator_release(tmp_path / "cache")
    client = SshClient(host)
    venv = ensure_installed(client, release)
    made_at = (Path(venv) / ".installed").stat().st_mtime_ns
    ran = client.run(f"{venv}/bin/echo2 --help", timeout_s=120)
    assert ran.returncode == 0 and "worker" in ran.stdout
    assert ensure_installed(client, release) == venv and (Path(venv) / ".installed").stat().st_mtime_ns == made_at
    assert (Path(tmp_path / "work" / "wheels") / release.version / release.wheel.name).is_file()
    # another source tree of the same version number: same wheel file name, its own wheel and venv
    assert install_step(client, Release(release.wheel, f"{release.version}x")) == "ship"
    full = _host(sshd, work_dir=str(tmp_path / "work"), min_free_mb=10 ** 9)
    with pytest.raises(SshFailure) as caught:
        ensure_installed(SshClient(full), release)
    assert caught.value.kind == "disk_full" and "free at least" in str(caught.value)
