"""How a worker obtains the bytes of a published version. The interface is one coroutine,
`fetch(info) -> verified payload`; the direct fetcher pulls from the URL in the announcement and
verifies every chunk against the manifest as it streams in."""

from __future__ import annotations

import asyncio
from abc import ABC, abstractmethod

import aiohttp

from echo2.broadcast.manifest import Manifest, verify_chunk
from echo2.protocol.http import RefusedError, TransientError
from echo2.protocol.messages import VersionInfo

# a stalled sender is cut off after this long without a byte; a healthy loopback or WAN stream
# delivers something far more often
STALL_TIMEOUT_S = 30.0


class WeightFetcher(ABC):
    @abstractmethod
    async def fetch(self, info: VersionInfo) -> bytes:
        """The complete payload of `info.version`, every chunk verified. Raises on failure."""


class DirectFetcher(WeightFetcher):
    def __init__(self, session: aiohttp.ClientSession) -> None:
        self.session = session

    async def fetch(self, info: VersionInfo) -> bytes:
        timeout = aiohttp.ClientTimeout(total=None, sock_connect=10, sock_read=STALL_TIMEOUT_S)
        try:
            async with self.session.get(info.weights_url, timeout=timeout) as resp:
                if resp.status in (401, 403):
                    raise RefusedError(resp.status, (await resp.text())[:300])
                if resp.status != 200:
                    # 404: the learner no longer (or not yet) holds it; a newer version will come
                    raise TransientError(f"version {info.version}: HTTP {resp.status}")
                return await _read_verified(resp.content, info.manifest)
        except (aiohttp.ClientError, TimeoutError, asyncio.IncompleteReadError) as exc:
            raise TransientError(f"fetch version {info.version}: {exc!r}") from exc


async def _read_verified(stream: aiohttp.StreamReader, manifest: Manifest) -> bytes:
    """Read exactly the manifest's chunks, verifying each; refuse anything extra."""
    out = bytearray()
    for index in range(manifest.num_chunks):
        start, end = manifest.chunk_span(index)
        chunk = await stream.readexactly(end - start)
        if not verify_chunk(manifest, index, chunk):
            raise TransientError(f"chunk {index} of version {manifest.version} failed sha256")
        out += chunk
    if await stream.read(1):
        raise TransientError(f"version {manifest.version}: sender sent more than {manifest.total_bytes} bytes")
    return bytes(out)
