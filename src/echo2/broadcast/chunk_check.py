"""The coordinator's own look at a reported relay: it asks the relay for the one chunk a worker
said was bad, as a child would (the relay's wire format, `wire`), and judges what comes back
against the signed manifest. A worker's report is only a claim; this is the check the
coordinator controls before it drops a relay for everyone.

Verdicts:
- "bad": the relay sent what no honest relay sends (a chunk failing its sha256, the wrong
  length, another chunk, a claim to hold the chunk with keepalives instead of it);
- "good": the genuine chunk;
- "unreachable": it could not be asked (connection failed, HTTP error, timed out, no longer
  holds the version). That confirms nothing, against the relay or the reporter.

A relay can tell the coordinator's requests apart and answer them honestly; the check then
refutes a true report. That is the limit of a check by one party (docs/security.md)."""

from __future__ import annotations

import asyncio
from typing import Literal

import aiohttp

from echo2.broadcast import wire
from echo2.protocol.manifest import Manifest, sha256_hex

ChunkVerdict = Literal["good", "bad", "unreachable"]


async def check_chunk(session: aiohttp.ClientSession, url: str, manifest: Manifest, index: int, *,
                      headers: dict[str, str], timeout_s: float) -> tuple[ChunkVerdict, str]:
    """Chunk `index` of `manifest`'s version and form from the relay at `url`, judged; returns
    the verdict and what was seen (the sha256 of the bytes received, or why none were)."""
    if not 0 <= index < manifest.num_chunks:
        raise ValueError(f"chunk {index} does not exist (version {manifest.version} has {manifest.num_chunks})")
    params = {"version": str(manifest.version), "start": str(index), "form": manifest.form}
    try:
        async with asyncio.timeout(timeout_s):
            async with session.get(url + wire.CHUNKS_PATH, params=params, headers=headers, allow_redirects=False,
                                   timeout=aiohttp.ClientTimeout(total=timeout_s)) as response:
                if response.status != 200:
                    return "unreachable", f"HTTP {response.status}"
                return await _first_chunk(response.content, manifest, index)
    except TimeoutError:
        return "unreachable", f"no chunk within {timeout_s:g} s"
    except asyncio.IncompleteReadError:
        return "unreachable", "the stream ended before the chunk"
    except (aiohttp.ClientError, OSError) as exc:
        return "unreachable", f"connection failed: {type(exc).__name__}"


async def _first_chunk(content: aiohttp.StreamReader, manifest: Manifest, index: int) -> tuple[ChunkVerdict, str]:
    start, end = manifest.chunk_span(index)
    while True:
        kind, at, length = wire.FRAME.unpack(await content.readexactly(wire.FRAME.size))
        if kind == wire.KEEPALIVE:
            if at > index:
                return "bad", f"claims {at} chunks but sends keepalives instead of chunk {index}"
            continue  # it does not hold the chunk yet: wait (within the timeout)
        if kind == wire.ERROR:
            return "unreachable", "the relay gave up on the version"
        if kind != wire.DATA:
            return "bad", f"unknown frame kind {kind!r}"
        if at != index:
            return "bad", f"sent chunk {at} when asked for chunk {index}"
        if length != end - start:
            return "bad", f"announced chunk {index} as {length} bytes; the manifest says {end - start}"
        got = sha256_hex(await content.readexactly(length))
        verdict: ChunkVerdict = "good" if got == manifest.chunk_sha256[index] else "bad"
        return verdict, f"sha256 {got}"
