"""What a worker tells its operator when the coordinator cannot be reached or refuses it: the
symptom and the fix, in one place for the running worker and `echo2 worker --check`."""

from __future__ import annotations

import json

from pydantic import ValidationError

from echo2.protocol.http import RefusedError
from echo2.protocol.messages import RegisterResponse, protocol_mismatch


class WorkerFailed(Exception):
    """The worker cannot go on; the message says why and what to check."""


def unreachable_fix(url: str) -> str:
    return (f"check that the coordinator is running, that {url} is its address as seen from this machine "
            "(started with --set coordinator.host=0.0.0.0, or an address of its own, and the port it listens "
            "on), and that no firewall blocks that port")


def refusal_fix(exc: RefusedError, url: str, path: str) -> str:
    """The coordinator (or whatever answers at `url`) refused `path`: why, and what to change."""
    if exc.status == 401:
        return ("the coordinator refused this worker's join token: set $ECHO2_AUTH_TOKEN (or auth_token) to the "
                "run's join token, the coordinator's $ECHO2_AUTH_TOKEN")
    if exc.status in (404, 405):
        return (f"{url}{path} does not exist (HTTP {exc.status}): is --coordinator the coordinator's "
                "http://HOST:PORT, with no path, and not another service?")
    if exc.status == 426:
        return exc.message  # names both protocol versions and the fix
    return f"the coordinator refused {path} with HTTP {exc.status}: {exc.message}"


def registration_reply(text: str) -> RegisterResponse:
    """The coordinator's answer to a registration; one from another echo2 release is refused
    with both versions named, not as some malformed field."""
    try:
        return RegisterResponse.model_validate_json(text)
    except ValidationError:
        try:
            data = json.loads(text)
        except ValueError:
            raise WorkerFailed(f"the coordinator's registration reply is not JSON: {text[:200]!r}") from None
        problem = protocol_mismatch(data.get("protocol") if isinstance(data, dict) else None, "",
                                    here="this worker", there="the coordinator")
        if problem:
            raise WorkerFailed(problem) from None
        raise
