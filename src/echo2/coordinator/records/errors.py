"""The one error the coordinator's state machine raises: a refused request."""

from __future__ import annotations


class RequestError(Exception):
    """A refused request: HTTP status and a message saying what was wrong and what to do."""

    def __init__(self, status: int, message: str, *, retry_after_s: float | None = None) -> None:
        super().__init__(message)
        self.status = status
        self.message = message
        self.retry_after_s = retry_after_s
        """When to ask again (sent as Retry-After), for a refusal that passes."""
