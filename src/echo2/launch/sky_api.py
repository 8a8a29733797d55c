"""The seam between the SkyPilot fleet and SkyPilot: four calls of its client SDK (`SkyApi`), and
the real implementation over SkyPilot 0.14 (`SkySdk`).

SkyPilot 0.14's SDK is asynchronous: `sky.launch`, `sky.down` and `sky.status` each post a
request to the SkyPilot API server and return its id at once, and `sky.get(request_id)` waits for
the request's result (or raises its error). `sky.get` itself has no timeout (it reads the
answer with none), and the posts retry inside the SDK, so every call here runs on a helper
thread and is given up on after its time: a hung API server costs the fleet a timeout, never its
thread pool or the launcher's loop. A `get` given up on also cancels the request, so the server
does not go on launching a machine nobody waits for.

Tests stand a recording fake in for `SkyApi` (tests/unit/test_skypilot_fleet.py); the fake
declares the Protocol and a test checks both it and `SkySdk` against it signature by signature."""

from __future__ import annotations

import threading
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Protocol, TypeVar

if TYPE_CHECKING:
    import sky

T = TypeVar("T")

SUBMIT_TIMEOUT_S = 60.0
"""Posting one request to the API server: a local server answers in well under a second; a
minute rides out a remote one's restart, and SkyPilot's own retries of a failed post inside it."""
IDLE_DOWN_MINUTES = 10
"""A cluster tears itself down after this long without a running job: the worker exits when its
coordinator has been unreachable for a few minutes (worker.coordinator_unreachable_s), so a
controller killed before it could release its machines stops paying within a quarter hour."""


@dataclass(frozen=True)
class SkyTimeouts:
    launch_s: float = 1800.0
    """Provisioning (minutes; spot and any_of alternatives may be tried in turn) plus the setup's
    pip install of echo2, torch and vLLM (5-10 min on a fresh image): half an hour, then the next class."""
    down_s: float = 600.0
    """Terminating a cluster takes a minute or two; ten ride out a slow cloud API."""
    status_s: float = 120.0
    """A status refresh asks each cloud about its spot clusters: seconds, rarely a minute."""
    status_every_s: float = 30.0
    """How often clusters are checked for preemption: the coordinator takes longer than this to
    declare a silent worker lost, and both are needed before a replacement starts."""
    retry_after_s: float = 300.0
    """A worker no class could be launched for (quota, no capacity anywhere) is not tried again
    before this, so the controller choosing it again does not hammer the clouds."""


def cluster_states(records: Any) -> dict[str, str]:
    """{cluster: status} from `sky.status`'s result (StatusResponse objects, their status an enum)
    or from plain dicts; a cluster SkyPilot no longer knows is absent."""
    out: dict[str, str] = {}
    for record in records or []:
        name = record["name"] if isinstance(record, dict) else record.name
        status = record["status"] if isinstance(record, dict) else record.status
        out[name] = str(getattr(status, "value", status))
    return out


class ClusterGone(LookupError):
    """SkyPilot no longer knows the cluster (downed, or never launched): nothing there bills."""


class SkyApi(Protocol):
    """What the SkyPilot fleet asks of SkyPilot. Each call but `get` returns a request id at once;
    `get` waits up to `timeout_s` for that request's result and raises its error, `TimeoutError`,
    or `ClusterGone` where the request's cluster does not exist."""

    def launch(self, task: sky.Task, cluster_name: str) -> str:
        """Provision `cluster_name` for `task` and run its setup and run commands."""
        ...

    def down(self, cluster_name: str) -> str:
        """Tear the cluster down: its machines are handed back and bill no more."""
        ...

    def status(self, cluster_names: list[str]) -> str:
        """The clusters' states, as the cloud reports them for spot clusters; the result lists
        each cluster that still exists (a record with `name` and `status`, "UP" when running)."""
        ...

    def get(self, request_id: str, timeout_s: float) -> Any:
        """The request's result, waiting at most `timeout_s`."""
        ...


class SkySdk:
    """SkyApi over SkyPilot 0.14's client SDK (`sky.launch`, `sky.down`, `sky.status`, `sky.get`)."""

    def __init__(self, *, submit_timeout_s: float = SUBMIT_TIMEOUT_S,
                 idle_down_minutes: int | None = IDLE_DOWN_MINUTES) -> None:
        """`idle_down_minutes`: the clusters' autodown after that long with no running job (None:
        none; then a killed controller's machines bill until `echo2 fleet down` or `sky down`)."""
        self.submit_timeout_s, self.idle_down_minutes = submit_timeout_s, idle_down_minutes

    def launch(self, task: sky.Task, cluster_name: str) -> str:
        import sky

        down = self.idle_down_minutes is not None
        return self._submit(lambda: sky.launch(task, cluster_name=cluster_name, retry_until_up=False,
                                               idle_minutes_to_autostop=self.idle_down_minutes, down=down))

    def down(self, cluster_name: str) -> str:
        import sky

        return self._submit(lambda: sky.down(cluster_name))

    def status(self, cluster_names: list[str]) -> str:
        import sky

        # AUTO: spot clusters (and those with autostop) are asked of the cloud, so a preempted
        # machine shows as gone or stopped rather than as the UP SkyPilot last recorded
        return self._submit(lambda: sky.status(cluster_names, refresh=sky.StatusRefreshMode.AUTO))

    def get(self, request_id: str, timeout_s: float) -> Any:
        import sky
        from sky import exceptions

        try:
            return within(timeout_s, lambda: sky.get(request_id), what=f"SkyPilot request {request_id}")
        except TimeoutError:
            self._cancel(request_id)
            raise
        except exceptions.ClusterDoesNotExist as exc:
            raise ClusterGone(str(exc)) from exc

    def _submit(self, post: Callable[[], Any]) -> str:
        return str(within(self.submit_timeout_s, post, what="posting to the SkyPilot API server"))

    def _cancel(self, request_id: str) -> None:
        import sky

        try:
            within(self.submit_timeout_s, lambda: sky.api_cancel(request_id, silent=True),
                   what=f"cancelling SkyPilot request {request_id}")
        except Exception:  # best effort: the request's cluster is downed after anyway
            pass


def within(timeout_s: float, call: Callable[[], T], *, what: str) -> T:
    """`call()` on a daemon thread, waited for at most `timeout_s` (a call that never returns
    keeps only that thread, which the process does not wait for at exit)."""
    box: dict[str, Any] = {}
    done = threading.Event()

    def run() -> None:
        try:
            box["value"] = call()
        except BaseException as exc:  # handed to the caller's thread as is
            box["error"] = exc
        finally:
            done.set()

    threading.Thread(target=run, name="skypilot-call", daemon=True).start()
    if not done.wait(timeout_s):
        raise TimeoutError(f"{what}: no answer within {timeout_s:.0f} s")
    if "error" in box:
        raise box["error"]
    return box["value"]
