"""What the `ssh` provider does on a host, each step one SSH call of a short POSIX sh script:
make sure the host runs the coordinator's exact echo2 (its wheel shipped once, installed into a
venv kept per version), start a worker detached under its worker id with its settings (the join
token among them) in a 0600 file written from stdin, and stop it: SIGTERM, SIGKILL after a grace
period, then a check that it is gone. A process is only ever signalled when its command line
names the worker's config file, so a PID reused by another process is never touched."""

from __future__ import annotations

import json
import shlex
from dataclasses import dataclass
from pathlib import Path

from echo2.config.inventory import SshHost
from echo2.config.worker import WorkerConfig
from echo2.launch.ssh_client import SshClient, SshFailure

PROBE_TIMEOUT_S = 60.0
SHIP_TIMEOUT_S = 300.0
"""A wheel of a few MB over a slow link, with room to spare."""
INSTALL_TIMEOUT_S = 1800.0
"""A fresh host may download torch and CUDA libraries (GBs): pip's own progress is the host's log."""
START_TIMEOUT_S = 60.0

# exit statuses of the scripts below, each a failure the user can fix
_PROBE_EXITS = {20: "no_python", 21: "old_python", 22: "disk_full"}

_PROBE = r"""
PY=$1 WORK=$2 VENV=$3 WHEEL=$4 MIN_FREE_KB=$5
command -v "$PY" >/dev/null 2>&1 || exit 20
"$PY" -c 'import sys; sys.exit(0 if sys.version_info >= (3, 11) else 1)' || { "$PY" -V >&2; exit 21; }
mkdir -p "$WORK/wheels" "$WORK/venvs" || exit 22
FREE_KB=$(df -Pk "$WORK" | awk 'NR == 2 {print $4}')
[ "$FREE_KB" -ge "$MIN_FREE_KB" ] || { echo "$FREE_KB KiB free" >&2; exit 22; }
if [ -f "$VENV/.installed" ]; then echo ready
elif [ -f "$WORK/wheels/$WHEEL" ]; then echo install
else echo ship; fi
"""

_SHIP = r"""
WORK=$1 WHEEL=$2
mkdir -p "$(dirname "$WORK/wheels/$WHEEL")" || exit 22
cat > "$WORK/wheels/$WHEEL.part" && mv "$WORK/wheels/$WHEEL.part" "$WORK/wheels/$WHEEL" || exit 22
"""

# The venv sees the host interpreter's packages (a .pth file with its site dirs, after its own):
# a GPU image's torch is used as it is, and pip installs only what is missing. `.installed` is
# written last, so a venv cut short by a failure is made again, never half used.
_INSTALL = r"""
PY=$1 WORK=$2 VENV=$3 WHEEL=$4
rm -rf "$VENV" && "$PY" -m venv "$VENV" >&2 || exit 23
SITE=$("$VENV/bin/python" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])') || exit 23
"$PY" -c 'import site; print("\n".join(site.getsitepackages()))' > "$SITE/_echo2_host_python.pth" || exit 23
"$VENV/bin/python" -m pip install --disable-pip-version-check --no-input -q "$WORK/wheels/$WHEEL" >&2 || exit 24
"$VENV/bin/echo2" --help > /dev/null || exit 24
touch "$VENV/.installed"
"""

_START = r"""
RUN=$1 VENV=$2 ID=$3 URL=$4
mkdir -p "$RUN" && cd "$RUN" || exit 25
umask 077
cat > "$ID.toml" || exit 22
setsid "$VENV/bin/echo2" worker --coordinator "$URL" --config "$RUN/$ID.toml" >> "$RUN/$ID.log" 2>&1 < /dev/null &
echo $! > "$ID.pid"
echo $!
"""

# PID 0: the ledger lost it (the launcher died between the start and its record): the start's
# pid file beside the worker's config says it
_ALIVE = r"""
PID=$1 MARK=$2
[ "$PID" = 0 ] && PID=$(cat "${MARK%.toml}.pid" 2>/dev/null || echo 0)
alive() { [ -r "/proc/$PID/cmdline" ] && tr '\000' ' ' < "/proc/$PID/cmdline" | grep -qF -- "$MARK"; }
"""

_STOP = _ALIVE + r"""
GRACE_TENTHS=$3
alive || { echo gone; exit 0; }
kill -TERM "$PID" 2>/dev/null
i=0
while alive && [ "$i" -lt "$GRACE_TENTHS" ]; do sleep 0.1; i=$((i + 1)); done
if alive; then kill -KILL "$PID" 2>/dev/null; sleep 0.5; fi
alive && exit 26
echo stopped
"""

_CHECK = _ALIVE + r"""
alive && echo running || echo gone
"""


@dataclass(frozen=True)
class Release:
    """What the worker on a host is: the echo2 wheel the coordinator runs, and where it lives there."""

    wheel: Path
    version: str

    def venv(self, host: SshHost) -> str:
        return f"{host.work_dir}/venvs/echo2-{self.version}"

    def wheel_on_host(self) -> str:
        """Its wheel under the host's wheels dir, in a folder of its own version: the file name
        says only echo2's version number, which two source trees share (a second release to the
        same host once installed the first one's wheel, found under the same name)."""
        return f"{self.version}/{self.wheel.name}"


def script(body: str, *args: object) -> str:
    """`sh -c BODY sh ARGS...`: the arguments quoted, never spliced into the script."""
    return " ".join(["sh", "-c", shlex.quote(body), "sh", *(shlex.quote(str(a)) for a in args)])


def ensure_installed(client: SshClient, release: Release) -> str:
    """The host's venv with this echo2 (made once per version and reused); returns its path."""
    host = client.host
    venv, wheel_name = release.venv(host), release.wheel_on_host()
    step = install_step(client, release)
    if step == "ship":
        shipped = client.run(script(_SHIP, host.work_dir, wheel_name), stdin=release.wheel.read_bytes(),
                             timeout_s=SHIP_TIMEOUT_S)
        _check(client, shipped.returncode, shipped.stderr, {22: "disk_full"})
    if step in ("ship", "install"):
        installed = client.run(script(_INSTALL, host.python, host.work_dir, venv, wheel_name),
                               timeout_s=INSTALL_TIMEOUT_S)
        _check(client, installed.returncode, installed.stderr, {23: "install_failed", 24: "install_failed"})
    return venv


def install_step(client: SshClient, release: Release) -> str:
    """What the host needs for this release: "ready", "install" (its wheel is there) or "ship"."""
    host = client.host
    probe = client.run(script(_PROBE, host.python, host.work_dir, release.venv(host), release.wheel_on_host(),
                              host.min_free_mb * 1024), timeout_s=PROBE_TIMEOUT_S)
    _check(client, probe.returncode, probe.stderr, _PROBE_EXITS)
    return probe.stdout.strip()


def run_dir_on(host: SshHost, run_id: str) -> str:
    return f"{host.work_dir}/runs/{run_id}"


def start_worker(client: SshClient, *, venv: str, run_id: str, worker: WorkerConfig, token: str,
                 coordinator_url: str) -> int:
    """Start `echo2 worker` detached (its own session: it outlives the SSH call); returns its PID.
    Its settings, the token among them, travel on stdin into a file only its user can read."""
    run_dir = run_dir_on(client.host, run_id)
    config = worker_toml(worker, token)
    started = client.run(script(_START, run_dir, venv, worker.worker_id, coordinator_url), stdin=config,
                         timeout_s=START_TIMEOUT_S)
    _check(client, started.returncode, started.stderr, {22: "disk_full", 25: "start_failed"})
    try:
        return int(started.stdout.strip().splitlines()[-1])
    except (ValueError, IndexError):
        printed = started.stdout.strip()[:100]
        raise SshFailure(client.host, "start_failed", f"starting worker {worker.worker_id} printed no PID "
                         f"({printed!r})",
                         f"look at {run_dir}/{worker.worker_id}.log there") from None


def config_marker(host: SshHost, run_id: str, worker_id: str) -> str:
    """What the worker's command line holds and no other process's does: its config file."""
    return f"{run_dir_on(host, run_id)}/{worker_id}.toml"


def stop_worker(client: SshClient, *, pid: int, marker: str, grace_s: float) -> str:
    """SIGTERM (the worker returns its leases and leaves), SIGKILL after `grace_s`, then checked
    gone. Returns "stopped" or "gone" (it had ended already)."""
    stopped = client.run(script(_STOP, pid, marker, int(grace_s * 10)), timeout_s=grace_s + START_TIMEOUT_S)
    _check(client, stopped.returncode, stopped.stderr, {26: "stop_failed"})
    return stopped.stdout.strip().splitlines()[-1] if stopped.stdout.strip() else "stopped"


def worker_running(client: SshClient, *, pid: int, marker: str) -> bool:
    checked = client.run(script(_CHECK, pid, marker), timeout_s=PROBE_TIMEOUT_S)
    return checked.stdout.strip() == "running"


def worker_toml(worker: WorkerConfig, token: str) -> bytes:
    """The worker's settings as TOML (dotted keys for nested tables; JSON scalars are TOML values),
    with the join token: the file is the one place it is written on the host."""
    lines = [f"auth_token = {json.dumps(token)}"]
    for key, value in _flatten(worker.model_dump(exclude={"auth_token"})):
        lines.append(f"{key} = {json.dumps(value)}")
    return ("\n".join(lines) + "\n").encode()


def _flatten(fields: dict, prefix: str = "") -> list[tuple[str, object]]:
    out: list[tuple[str, object]] = []
    for key, value in fields.items():
        if isinstance(value, dict):
            out += _flatten(value, f"{prefix}{key}.")
        elif value is not None:  # TOML has no null: every optional field's default
            out.append((f"{prefix}{key}", value))
    return out


def _check(client: SshClient, returncode: int, stderr: str, known: dict[int, str]) -> None:
    if returncode == 0:
        return
    host, said = client.host, " ".join(stderr.strip().splitlines()[-3:])[:300]
    kind = known.get(returncode)
    fixes = {
        "no_python": (f"no {host.python} there", "install Python 3.11 or later, or set python to its path"),
        "old_python": (f"{host.python} is older than 3.11 ({said})", "set python to a 3.11 or later interpreter"),
        "disk_full": (f"too little free space in {host.work_dir} ({said or 'a write failed'})",
                      f"free at least {host.min_free_mb} MB there, or set work_dir to a larger disk"),
        "install_failed": (f"installing echo2 failed ({said})", "install it by hand to see why (pip's output), "
                           f"in {host.work_dir}/venvs"),
        "start_failed": (f"the worker did not start ({said})", f"check that {host.work_dir} is writable"),
        "stop_failed": ("the worker survived SIGKILL", "log in and look at it (a process stuck in the kernel)"),
    }
    if kind is None:
        raise SshFailure(host, "start_failed", f"a step failed with status {returncode} ({said})",
                         "log in and run it by hand")
    problem, fix = fixes[kind]
    raise SshFailure(host, kind, problem, fix)  # type: ignore[arg-type]
