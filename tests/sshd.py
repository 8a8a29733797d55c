"""A real OpenSSH server for tests (Debian's openssh-server): one sshd on a loopback port (or
inside a network namespace, given a prefix), with its own host key and one authorized user key,
stopped by its PID when the test ends."""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
import time
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

SSHD = "/usr/sbin/sshd"


def sshd_unavailable_reason() -> str | None:
    if not Path(SSHD).is_file():
        return "no /usr/sbin/sshd (apt-get install openssh-server)"
    if shutil.which("ssh") is None or shutil.which("ssh-keygen") is None:
        return "no OpenSSH client (apt-get install openssh-client)"
    if os.geteuid() != 0:
        return "sshd needs root here"
    return None


@dataclass(frozen=True)
class Sshd:
    address: str
    port: int
    user_key: Path
    other_key: Path
    """A key the server does not accept."""
    known_hosts: Path
    """Empty: the host is unknown until added (`trust()`)."""
    host_key_pub: Path
    pid: int = 0
    """The sshd's own PID (`ip netns exec` execs it: the same process)."""

    def trust(self) -> None:
        line = self.host_key_pub.read_text().split()
        name = self.address if self.port == 22 else f"[{self.address}]:{self.port}"  # OpenSSH's own form
        self.known_hosts.write_text(f"{name} {line[0]} {line[1]}\n")


def _keygen(path: Path) -> None:
    subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", str(path)], check=True, timeout=30)


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


@contextmanager
def running_sshd(workdir: Path, *, address: str = "127.0.0.1", exec_prefix: list[str] | None = None):
    workdir.mkdir(parents=True, exist_ok=True)
    for name in ("host", "user", "other"):
        _keygen(workdir / name)
    (workdir / "authorized").write_text((workdir / "user.pub").read_text())
    (workdir / "known_hosts").write_text("")
    port = free_port() if exec_prefix is None else 22
    (workdir / "sshd_config").write_text(
        f"Port {port}\nListenAddress {address}\nHostKey {workdir / 'host'}\n"
        f"AuthorizedKeysFile {workdir / 'authorized'}\n"
        f"StrictModes no\nUsePAM no\nPasswordAuthentication no\nKbdInteractiveAuthentication no\n"
        f"PidFile {workdir / 'sshd.pid'}\n")
    Path("/run/sshd").mkdir(exist_ok=True)  # its privilege-separation directory
    with open(workdir / "sshd.log", "ab") as log:
        proc = subprocess.Popen([*(exec_prefix or []), SSHD, "-D", "-e", "-f", str(workdir / "sshd_config")],
                                stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
    try:
        _wait_listening(address, port, proc, exec_prefix)
        yield Sshd(address, port, workdir / "user", workdir / "other", workdir / "known_hosts",
                   workdir / "host.pub", proc.pid)
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(timeout=10)


def _wait_listening(address: str, port: int, proc: subprocess.Popen, exec_prefix: list[str] | None) -> None:
    deadline = time.monotonic() + 20
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"sshd exited with {proc.returncode}")
        probe = [*(exec_prefix or []), "bash", "-c", f"exec 3<>/dev/tcp/{address}/{port}"]
        if subprocess.run(probe, capture_output=True, timeout=10).returncode == 0:
            return
        time.sleep(0.1)
    raise RuntimeError("sshd did not listen within 20 s")
