"""The coordinator dialling a worker's relay address back (`echo2 worker --check`): a worker
cannot see from inside whether peers can reach it (NAT, a firewall, a wrong advertised host),
the coordinator can.

Anyone with the join token may ask, so the probe must not be a port scanner for the
coordinator's network: it dials only the caller's own address (the relay address's host is the
address the request came from, or a name that resolves to it, and the connection goes to that
address, not to whatever the name resolves to a moment later); it presents no credential (the
relay's status route tells anyone that an echo2 relay listens there, and nothing else); it
follows no redirect; and it answers one of two fixed texts, reachable or not, so a closed port,
an SSH server, a web server and a TLS failure all read the same."""

from __future__ import annotations

import asyncio
import ipaddress
import json
import socket
from urllib.parse import urlsplit

import aiohttp
from aiohttp.abc import AbstractResolver, ResolveResult

from echo2.broadcast.wire import RELAY_MARK, STATUS_PATH
from echo2.config.tls import TLSConfig
from echo2.coordinator.records.errors import RequestError
from echo2.protocol import tls

PROBE_TIMEOUT_S = 5.0
"""A relay answers its status route in milliseconds even across an ocean (~0.3 s round trip);
a NAT'd address never answers, and the operator is waiting for the verdict."""
RESOLVE_TIMEOUT_S = 3.0
"""A name server answers in milliseconds; one that does not must not hold the probe (and the
operator) past the probe's own timeout."""
MAX_STATUS_BYTES = 4096
"""A relay's status answer is under 200 bytes; a larger body is not one."""
REACHED = "the relay answered"
NOT_REACHED = ("no echo2 relay answered there: nothing listens, something else does, or NAT or a firewall drops "
               "incoming connections (an https:// relay also needs a certificate that chains to the coordinator's "
               "tls.ca_file and names the advertised host)")
"""The one answer for every failure: which of them it was would tell the caller what listens
where, and the fix is the same (the worker's `--check` line adds it)."""
_CHARACTERS = frozenset(map(chr, range(0x21, 0x7F)))  # printable ASCII, no space: urlsplit drops \t\r\n silently


def check_relay_address(address: str) -> str | None:
    """Why `address` is not a relay address (http://HOST:PORT, nothing more), or None."""
    if not set(address) <= _CHARACTERS:
        return f"relay address {address!r}: expected http://HOST:PORT with no spaces or control characters"
    parts = urlsplit(address)
    try:
        port = parts.port
    except ValueError:  # a port that is no number, or over 65535
        port = None
    if parts.scheme not in ("http", "https") or not parts.hostname or port is None:
        return f"relay address {address!r}: expected http://HOST:PORT"
    if parts.path not in ("", "/") or parts.query or parts.fragment or parts.username:
        return f"relay address {address!r}: expected http://HOST:PORT with no path, query or user"
    return None


async def own_address(address: str, remote: str) -> str:
    """The IP address to dial for `address` (a valid relay address): its host when that is
    `remote`, the caller's address, or `remote` when the host is a name that resolves to it.
    Anything else is refused (403) with one message, whether the name resolved elsewhere or not
    at all: what a name resolves to inside the coordinator's network is not the caller's to learn."""
    caller, host = _ip(remote), urlsplit(address).hostname or ""
    literal = _ip(host)
    if caller is not None and literal == caller:
        return str(caller)
    if caller is not None and literal is None and caller in await _resolve(host):
        return str(caller)
    raise RequestError(403, (
        f"relay_address={address!r}: the probe only dials back the caller's own address, and {host!r} is not "
        f"the address this request came from ({remote or 'unknown'}); fix: run `echo2 worker --check` on the "
        "machine whose relay it is, with relay_advertise_host set to the address it reaches the coordinator from"))


async def probe_relay(address: str, tls_config: TLSConfig | None = None, *,
                      dial: str | None = None) -> tuple[bool, str]:
    """(reachable, detail): whether an echo2 relay answered its status route at `address`,
    `detail` REACHED or NOT_REACHED. `dial`: the IP address to connect to for the address's host
    (`own_address`; None: resolve it). An https:// relay must present a certificate that chains
    to `tls_config.ca_file` and names the host."""
    connector = aiohttp.TCPConnector(ssl=tls.client_context(tls_config or TLSConfig()),
                                     resolver=_Pinned(dial) if dial else None)
    try:
        async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=PROBE_TIMEOUT_S),
                                         connector=connector) as session:
            # no Authorization header: the probe presents no credential to whatever listens there
            async with session.get(address.rstrip("/") + STATUS_PATH, allow_redirects=False) as resp:
                if resp.status == 200 and 0 < (resp.content_length or 0) <= MAX_STATUS_BYTES:
                    body = json.loads(await resp.read())
                    if isinstance(body, dict) and body.get("relay") == RELAY_MARK:
                        return True, REACHED
    except (aiohttp.ClientError, TimeoutError, OSError, ValueError):
        pass  # every failure is the same answer (the module docstring says why)
    return False, NOT_REACHED


def _ip(text: str) -> ipaddress.IPv4Address | ipaddress.IPv6Address | None:
    """`text` as an IP address (an IPv4-mapped IPv6 address as its IPv4 one), or None."""
    try:
        ip = ipaddress.ip_address(text.strip("[]"))
    except ValueError:
        return None
    mapped = getattr(ip, "ipv4_mapped", None)
    return mapped or ip


async def _resolve(host: str) -> set[ipaddress.IPv4Address | ipaddress.IPv6Address]:
    """The addresses `host` resolves to (getaddrinfo, in the loop's thread pool); none when it
    does not resolve within RESOLVE_TIMEOUT_S."""
    try:
        infos = await asyncio.wait_for(asyncio.get_running_loop().getaddrinfo(host, None, type=socket.SOCK_STREAM),
                                       RESOLVE_TIMEOUT_S)
    except (OSError, TimeoutError, UnicodeError):
        return set()
    return {ip for ip in (_ip(str(info[4][0])) for info in infos) if ip is not None}


class _Pinned(AbstractResolver):
    """Resolves every name to the one address `own_address` checked, so a name that resolves to
    the caller when checked cannot resolve elsewhere when dialled (DNS rebinding); TLS still
    checks the certificate against the name."""

    def __init__(self, ip: str) -> None:
        self.ip = ip

    async def resolve(self, host: str, port: int = 0,
                      family: socket.AddressFamily = socket.AF_INET) -> list[ResolveResult]:
        family = socket.AF_INET6 if ipaddress.ip_address(self.ip).version == 6 else socket.AF_INET
        return [ResolveResult(hostname=host, host=self.ip, port=port, family=family, proto=0,
                              flags=socket.AI_NUMERICHOST)]

    async def close(self) -> None:
        pass
