"""The trusted-worker token: where a run's environment is worker-trusted (task.trust: tools the
coordinator cannot replay, so the rewards rest on the workers' tool answers), a worker presents
it in this header when it registers, and the coordinator admits no worker without it
(coordinator.parts.credentials). A worker reads it from $ECHO2_TRUSTED_TOKEN, or from the file
$ECHO2_TRUSTED_TOKEN_FILE names; never from its config, which is written to the run dir."""

from __future__ import annotations

import os
from pathlib import Path

TRUSTED_HEADER = "X-Echo2-Trusted-Worker"
TRUSTED_TOKEN_VARIABLE = "ECHO2_TRUSTED_TOKEN"


def trusted_worker_token() -> str:
    """This worker's trusted-worker token ("" when it holds none)."""
    value = os.environ.get(TRUSTED_TOKEN_VARIABLE, "")
    named = os.environ.get(f"{TRUSTED_TOKEN_VARIABLE}_FILE", "")
    if value or not named:
        return value
    if not Path(named).is_file():
        raise ValueError(f"{TRUSTED_TOKEN_VARIABLE}_FILE={named!r} does not exist")
    return Path(named).read_text().strip()
