"""Who may call what on the coordinator. Four credentials, one per role:

- the **join token**, shared with every worker of the run: register, read the broadcast config,
  have a relay address probed (peers also authenticate chunk streams between relays with it);
- a **worker credential**, issued at registration and bound to that worker id: every later
  worker call (heartbeat, lease, rollout, leave, bad-peer report) must carry it, and may only
  speak for its own worker id;
- the **learner token**: publish versions, take and reject batches;
- the **operator token**: read the coordinator's state, its Prometheus `/metrics`, and the
  dashboard (`viewer` routes: the token as a bearer header, or the session cookie the dashboard's
  login form exchanges it for; see echo2.coordinator.http.dashboard).

With only the join token a client can join as a new worker and nothing more: it cannot
publish, take the learner's batches, or act as another worker. Where the run's environment is
worker-trusted (task.trust: tools the coordinator cannot replay) a worker must also present the
**trusted-worker token** when it registers (header X-Echo2-Trusted-Worker; ECHO2_TRUSTED_TOKEN,
by default `<run_dir>/keys/trusted.token`): the run's rewards rest on the workers holding it.

Secrets come from the environment (ECHO2_AUTH_TOKEN, ECHO2_LEARNER_TOKEN, ECHO2_OPERATOR_TOKEN)
or from files named by ECHO2_<NAME>_FILE; the learner and operator tokens default to files the
coordinator creates in `<run_dir>/keys/` (owner-readable only), which `echo2 learner` on the
same machine reads. None of them is ever written to config.json or the logs.
"""

from __future__ import annotations

import hashlib
import hmac
import os
import secrets
from dataclasses import dataclass
from pathlib import Path

MIN_TOKEN_CHARS = 16
SECRET_VARIABLES = frozenset(f"ECHO2_{name}{suffix}" for name in ("AUTH_TOKEN", "LEARNER_TOKEN", "OPERATOR_TOKEN",
                                                                  "TRUSTED_TOKEN") for suffix in ("", "_FILE"))


JOIN, WORKER, LEARNER, OPERATOR, VIEWER, OPEN = "join", "worker", "learner", "operator", "viewer", "open"
TRUSTED = "trusted"
ROUTE_ROLES: dict[tuple[str, str], str] = {
    ("GET", "/healthz"): OPEN,
    ("POST", "/v1/register"): JOIN,
    ("GET", "/v1/broadcast_config"): JOIN,
    ("POST", "/v1/probe"): JOIN,
    ("POST", "/v1/heartbeat"): WORKER,
    ("GET", "/v1/news"): WORKER,
    ("POST", "/v1/lease"): WORKER,
    ("POST", "/v1/rollout"): WORKER,
    ("POST", "/v1/evaluation"): WORKER,
    ("GET", "/v1/evaluation"): LEARNER,
    ("POST", "/v1/leave"): WORKER,
    ("POST", "/v1/bad_peer"): WORKER,
    ("POST", "/v1/publish"): LEARNER,
    ("POST", "/v1/batch"): LEARNER,
    ("POST", "/v1/batch/reject"): LEARNER,
    ("POST", "/v1/audit"): LEARNER,
    ("GET", "/v1/state"): OPERATOR,
    ("GET", "/metrics"): OPERATOR,  # Prometheus: `authorization: {credentials_file: operator.token}`
    ("GET", "/"): VIEWER,  # without a credential: the login form (401)
    ("GET", "/dashboard/state.json"): VIEWER,
    ("GET", "/dashboard/app.js"): VIEWER,
    ("GET", "/dashboard/app.css"): VIEWER,
    ("POST", "/dashboard/login"): OPEN,  # checks the operator token it is given
}


@dataclass(frozen=True)
class Secrets:
    join: str
    learner: str
    operator: str
    trusted: str = ""
    """The trusted-worker token; empty: the run takes no worker's word (none is asked for)."""

    def __post_init__(self) -> None:
        if self.trusted and (len(self.trusted) < MIN_TOKEN_CHARS
                             or self.trusted in (self.join, self.learner, self.operator)):
            raise ValueError(f"the trusted-worker token (ECHO2_TRUSTED_TOKEN) must have {MIN_TOKEN_CHARS} characters "
                             "or more and differ from the join, learner and operator tokens")
        for role, value in (("join (ECHO2_AUTH_TOKEN)", self.join), ("learner (ECHO2_LEARNER_TOKEN)", self.learner),
                            ("operator (ECHO2_OPERATOR_TOKEN)", self.operator)):
            if len(value) < MIN_TOKEN_CHARS:
                raise ValueError(f"the {role} token is missing or shorter than {MIN_TOKEN_CHARS} characters")
        if len({self.join, self.learner, self.operator}) != 3:
            raise ValueError("the join, learner and operator tokens must differ: each grants a different role")


def read_secret(name: str, default_file: Path | None = None, create: bool = False) -> str:
    """ECHO2_<NAME>, else the file ECHO2_<NAME>_FILE names, else `default_file` (created with a
    fresh random token when `create`); "" when none exists."""
    value = os.environ.get(f"ECHO2_{name}", "")
    if value:
        return value
    named = os.environ.get(f"ECHO2_{name}_FILE", "")
    path = Path(named) if named else default_file
    if path is None:
        return ""
    if not path.is_file():
        if named:
            raise ValueError(f"ECHO2_{name}_FILE={named!r} does not exist")
        if not create:
            return ""
        _write_private(path, secrets.token_hex(32))
    return path.read_text().strip()


def key_file(run_path: Path, role: str) -> Path:
    return run_path / "keys" / f"{role}.token"


def coordinator_secrets(run_path: Path, configured_join: str, *, trusted_workers: bool = False) -> Secrets:
    """`trusted_workers`: the run's environment is worker-trusted, so its workers must present
    the trusted-worker token (made in the run dir unless set)."""
    return Secrets(
        join=configured_join or read_secret("AUTH_TOKEN"),
        learner=read_secret("LEARNER_TOKEN", key_file(run_path, LEARNER), create=True),
        operator=read_secret("OPERATOR_TOKEN", key_file(run_path, OPERATOR), create=True),
        trusted=read_secret("TRUSTED_TOKEN", key_file(run_path, TRUSTED), create=True) if trusted_workers else "",
    )


def holds_trusted_token(secrets: Secrets, presented: str) -> bool:
    return bool(secrets.trusted) and hmac.compare_digest(presented.encode(), secrets.trusted.encode())


def new_worker_credential() -> tuple[str, str]:
    """(the credential handed to the worker once, the digest the coordinator keeps)."""
    credential = secrets.token_hex(32)
    return credential, credential_digest(credential)


def credential_digest(credential: str) -> str:
    return hashlib.sha256(credential.encode()).hexdigest()


def _write_private(path: Path, text: str) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    with os.fdopen(fd, "w") as handle:
        handle.write(text + "\n")
