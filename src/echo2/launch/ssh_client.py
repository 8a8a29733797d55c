"""One SSH host, through the OpenSSH client: each call is one `ssh` process with a timeout, batch
mode (no password or host-key prompt ever waits on a terminal) and the inventory's host-key
policy. A failure the client reports is turned into one line that names the host, what is wrong
and the fix (`SshFailure`), so a run can say it and go on with the hosts that work."""

from __future__ import annotations

import re
import subprocess
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

from echo2.config.inventory import SshHost

CONNECT_TIMEOUT_S = 10
"""A host that does not answer the TCP handshake and key exchange in this long is unreachable."""
ALIVE_INTERVAL_S = 5
"""Keepalives on an open session: three unanswered ones end it (a host lost mid-call)."""

FailureKind = Literal["host_key", "host_key_changed", "key_refused", "key_missing", "unreachable", "timeout",
                      "no_python", "old_python", "disk_full", "install_failed", "start_failed", "stop_failed"]


class SshFailure(Exception):
    """A host that cannot be used now: `str()` is the one line a user reads."""

    def __init__(self, host: SshHost, kind: FailureKind, problem: str, fix: str) -> None:
        super().__init__(f"host {host.name} ({host.destination}): {problem}; {fix}")
        self.host, self.kind = host, kind


@dataclass(frozen=True)
class SshResult:
    returncode: int
    stdout: str
    stderr: str


# what the OpenSSH client prints (to stderr, with exit status 255) for each way a login fails
_CLIENT_ERRORS: tuple[tuple[str, FailureKind], ...] = (
    (r"REMOTE HOST IDENTIFICATION HAS CHANGED", "host_key_changed"),
    (r"Host key verification failed|No \S+ host key is known", "host_key"),
    (r"Permission denied", "key_refused"),
    (r"Connection timed out|No route to host|Connection refused|Could not resolve|Network is unreachable"
     r"|Connection reset|Connection closed|timed out|kex_exchange_identification", "unreachable"),
)


class SshClient:
    def __init__(self, host: SshHost, *, connect_timeout_s: int = CONNECT_TIMEOUT_S) -> None:
        self.host, self.connect_timeout_s = host, connect_timeout_s

    def argv(self, remote_command: str) -> list[str]:
        host = self.host
        return ["ssh", "-T", "-p", str(host.port), "-i", str(Path(host.key_file).expanduser()),
                "-o", "BatchMode=yes", "-o", "IdentitiesOnly=yes", "-o", "LogLevel=ERROR",
                "-o", f"ConnectTimeout={self.connect_timeout_s}",
                "-o", f"ServerAliveInterval={ALIVE_INTERVAL_S}", "-o", "ServerAliveCountMax=3",
                "-o", f"StrictHostKeyChecking={'yes' if host.known_hosts == 'strict' else 'accept-new'}",
                "-o", f"UserKnownHostsFile={Path(host.known_hosts_file).expanduser()}",
                f"{host.user}@{host.address}", "--", remote_command]

    def run(self, remote_command: str, *, stdin: bytes = b"", timeout_s: float) -> SshResult:
        """Run `remote_command` (a POSIX sh line: it is visible in the host's process list, so it
        never holds a secret; secrets go on `stdin`). Raises SshFailure when the client cannot log
        in or the call outlives `timeout_s`; the command's own exit status is the caller's."""
        self._check_key()
        try:
            done = subprocess.run(self.argv(remote_command), input=stdin, capture_output=True, timeout=timeout_s)
        except subprocess.TimeoutExpired:
            raise SshFailure(self.host, "timeout", f"no answer within {timeout_s:.0f} s",
                             "check that the host is up and its link works (ssh to it by hand)") from None
        result = SshResult(done.returncode, done.stdout.decode(errors="replace"), done.stderr.decode(errors="replace"))
        if result.returncode == 255:
            raise self._client_failure(result.stderr)
        return result

    def _check_key(self) -> None:
        key = Path(self.host.key_file).expanduser()
        if not key.is_file():
            raise SshFailure(self.host, "key_missing", f"key_file {str(key)!r} does not exist",
                             "set key_file in the inventory to the private key that logs in to it")

    def _client_failure(self, stderr: str) -> SshFailure:
        host = self.host
        kind = next((k for pattern, k in _CLIENT_ERRORS if re.search(pattern, stderr)), "unreachable")
        said = " ".join(stderr.strip().splitlines()[-2:])[:200] or "ssh exited with status 255"
        known = Path(host.known_hosts_file).expanduser()
        fixes = {
            "host_key": (f"its host key is not in {known}",
                         f"add it after checking its fingerprint: ssh-keyscan -p {host.port} {host.address} >> {known}"
                         ", or set known_hosts = \"accept-new\" for this host"),
            "host_key_changed": (f"its host key differs from the one in {known}",
                                 "if the machine was reinstalled, remove the old key: ssh-keygen -R "
                                 f"'[{host.address}]:{host.port}' -f {known}; otherwise do not use it"),
            "key_refused": (f"it refused the key {host.key_file} for user {host.user}",
                            f"add the public key to ~{host.user}/.ssh/authorized_keys there: ssh-copy-id -i "
                            f"{host.key_file} -p {host.port} {host.user}@{host.address}"),
            "unreachable": (f"unreachable ({said})",
                            "check the address and port in the inventory and that sshd runs there"),
        }
        problem, fix = fixes[kind]
        return SshFailure(host, kind, problem, fix)
