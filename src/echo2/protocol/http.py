"""One JSON-over-HTTP call with a timeout and a clear split between transient failures (retry)
and refusals (a 4xx: the request was wrong; retrying the same request cannot help). A failed
TLS handshake raises `TLSError` (a ValueError: the command stops with its message)."""

from __future__ import annotations

import aiohttp
from pydantic import BaseModel

from echo2.protocol.tls import TLSError, describe_failure


class TransientError(Exception):
    """Connection refused/reset, timeout or 5xx: worth retrying later."""


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
    except aiohttp.ClientSSLError as exc:  # a certificate or URL must change: not transient
        raise TLSError(describe_failure(url, exc)) from None
    except aiohttp.ServerDisconnectedError as exc:
        hint = " (a TLS server hangs up on plain HTTP: is this URL https://?)" if url.startswith("http:") else ""
        raise TransientError(f"{method} {url}: {exc!r}{hint}") from exc
    except (aiohttp.ClientConnectionError, aiohttp.ClientPayloadError, TimeoutError) as exc:
        raise TransientError(f"{method} {url}: {_describe(exc, timeout_s)}") from exc
    if resp.status >= 500:
        raise TransientError(f"{method} {url}: HTTP {resp.status}: {text[:200]}")
    if resp.status >= 400:
        raise RefusedError(resp.status, _error_text(text))
    return text


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
