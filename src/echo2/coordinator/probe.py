"""The coordinator dialling a worker's relay address back (`echo2 worker --check`): a worker
cannot see from inside whether peers can reach it (NAT, a firewall, a wrong advertised host),
the coordinator can. The probe asks the relay's status route, with the join token the caller
holds anyway, and answers only reachable or not, and why: a join-token holder learns nothing
else about the coordinator's network."""

from __future__ import annotations

from urllib.parse import urlsplit

import aiohttp

from echo2.broadcast.wire import STATUS_PATH
from echo2.config.tls import TLSConfig
from echo2.protocol import tls

PROBE_TIMEOUT_S = 5.0
"""A relay answers its status route in milliseconds even across an ocean (~0.3 s round trip);
a NAT'd address never answers, and the operator is waiting for the verdict."""


def check_relay_address(address: str) -> str | None:
    """Why `address` is not a relay address (http://HOST:PORT, nothing more), or None."""
    parts = urlsplit(address)
    if parts.scheme not in ("http", "https") or not parts.hostname or parts.port is None:
        return f"relay address {address!r}: expected http://HOST:PORT"
    if parts.path not in ("", "/") or parts.query or parts.fragment or parts.username:
        return f"relay address {address!r}: expected http://HOST:PORT with no path, query or user"
    return None


async def probe_relay(address: str, join_token: str, tls_config: TLSConfig | None = None) -> tuple[bool, str]:
    """(reachable, detail): whether the relay at `address` answered its status route; an
    https:// relay must present a certificate that chains to `tls_config.ca_file`."""
    url = address.rstrip("/") + STATUS_PATH
    try:
        async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=PROBE_TIMEOUT_S),
                                         connector=tls.connector(tls_config or TLSConfig())) as session:
            async with session.get(url, headers={"Authorization": f"Bearer {join_token}"}) as resp:
                if resp.status == 200:
                    return True, "the relay answered"
                return False, f"something answered there with HTTP {resp.status}, not this run's relay"
    except aiohttp.ClientSSLError as exc:
        return False, tls.describe_failure(url, exc)
    except TimeoutError:
        return False, f"no answer within {PROBE_TIMEOUT_S:g} s (NAT or a firewall drops incoming connections)"
    except aiohttp.ClientError as exc:
        return False, f"{type(exc).__name__}: {exc}"
