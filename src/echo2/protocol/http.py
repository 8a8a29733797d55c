"""One JSON-over-HTTP call with a timeout and a clear split between transient failures (retry)
and refusals (a 4xx: the request was wrong; retrying the same request cannot help). A failed
TLS handshake raises `TLSError` (a ValueError: the command stops with its message)."""

from __future__ import annotations

import aiohttp
from pydantic import BaseModel

from echo2.protocol.tls import TLSError, describe_failure

MAX_RETRY_AFTER_S = 600.0
"""The longest a server's Retry-After is followed (a bigger one is a mistake or a hostile peer)."""


class TransientError(Exception):
    """Connection refused/reset, timeout or 5xx: worth retrying later (`retry_after_s`: when
    the server said to, by its Retry-After header; None: it did not say)."""

    def __init__(self, message: str, retry_after_s: float | None = None) -> None:
        super().__init__(message)
        self.retry_after_s = retry_after_s


class RefusedError(Exception):
    """The server answered 4xx; `status` and the server's message say why."""

    def __init__(self, status: int, message: str) -> None:
        super().__init__(f"HTTP {status}: {message}")
        self.status = status
        self.message = message


async def call(
    session: aiohttp.ClientSession, method: str, url: str, body: BaseModel | None, *, timeout_s: float,
    token: str | None = None,
) -> str:
    """`token`: the bearer token for this call instead of the session's (a worker registers with
    the join token, then calls with its own credential)."""
    data = body.model_dump_json() if body is not None else None
    headers = {"Content-Type": "application/json"}
    if token is not None:
        headers["Authorization"] = f"Bearer {token}"
    try:
        async with session.request(
            method, url, data=data, timeout=aiohttp.ClientTimeout(total=timeout_s), headers=headers,
        ) as resp:
            text = await resp.text()
            retry_after_s = _retry_after_s(resp.headers.get("Retry-After"))
    except aiohttp.ClientSSLError as exc:  # a certificate or URL must change: not transient
        raise TLSError(describe_failure(url, exc)) from None
    except aiohttp.ServerDisconnectedError as exc:
        hint = " (a TLS server hangs up on plain HTTP: is this URL https://?)" if url.startswith("http:") else ""
        raise TransientError(f"{method} {url}: {exc!r}{hint}") from exc
    except (aiohttp.ClientConnectionError, aiohttp.ClientPayloadError, TimeoutError) as exc:
        raise TransientError(f"{method} {url}: {_describe(exc, timeout_s)}") from exc
    if resp.status >= 500:
        raise TransientError(f"{method} {url}: HTTP {resp.status}: {_error_text(text)[:200]}", retry_after_s)
    if resp.status >= 400:
        raise RefusedError(resp.status, _error_text(text))
    return text


def _retry_after_s(value: str | None) -> float | None:
    """Retry-After in seconds (the delta form; a date is not followed), at most MAX_RETRY_AFTER_S."""
    try:
        seconds = float(value) if value is not None else None
    except ValueError:
        return None
    return None if seconds is None or not seconds >= 0 else min(seconds, MAX_RETRY_AFTER_S)


def _error_text(text: str) -> str:
    try:
        import json

        return str(json.loads(text).get("error", text))
    except (ValueError, AttributeError):
        return text[:500]


def _describe(exc: Exception, timeout_s: float) -> str:
    """A failed connection in words an operator can act on (a timeout's own text is empty)."""
    if isinstance(exc, TimeoutError):
        return f"no answer within {timeout_s:g} s"
    return f"{type(exc).__name__}: {exc}"
