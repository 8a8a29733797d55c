"""Relay wire format and the errors a stream can end with.

A child asks a source for `GET /v1/broadcast/chunks?version=V&start=K&form=F` (F: "full", the
default, or "delta") and receives a stream of frames, each a 9-byte header (kind, chunk index,
length; little-endian) and a body:

- `D` data: chunk `index`, `length` bytes (must equal the manifest's size for that chunk);
- `K` keepalive: the sender is alive but has nothing new; `index` is how many chunks it holds;
- `E` error: the sender gives up on this version (superseded, its own fetch failed); the body is
  a UTF-8 reason of at most MAX_ERROR_BYTES, and `index` is GONE when the sender will never
  have this version (it skipped it, or a newer one superseded it there), 0 otherwise.

Frames make a live-but-waiting relay (keepalives) distinguishable from a dead one (silence), and
let a child refuse an oversized chunk from its header alone, before reading its body.
"""

from __future__ import annotations

import struct

CHUNKS_PATH = "/v1/broadcast/chunks"
STATUS_PATH = "/v1/broadcast/status"
RELAY_MARK = "echo2"
"""The status route's `relay` field, also in its answer to a caller without the token: how the
coordinator's probe, which presents no credential, knows an echo2 relay answered."""
PEER_HEADER = "X-Echo2-Peer"
"""Requesting worker's id; used for per-child byte accounting only, never for authorization."""
CONTENT_TYPE = "application/x-echo2-chunks"

FRAME = struct.Struct("<cII")
DATA, KEEPALIVE, ERROR = b"D", b"K", b"E"
MAX_ERROR_BYTES = 4096
GONE = 1
"""Error-frame code: the version is obsolete at this sender; asking it again cannot help."""


def data_header(index: int, length: int) -> bytes:
    return FRAME.pack(DATA, index, length)


def keepalive_frame(held_chunks: int) -> bytes:
    return FRAME.pack(KEEPALIVE, held_chunks, 0)


def error_frame(reason: str, gone: bool = False) -> bytes:
    body = reason.encode()[:MAX_ERROR_BYTES]
    return FRAME.pack(ERROR, GONE if gone else 0, len(body)) + body


def bearer_headers(auth_token: str, peer_id: str) -> dict[str, str]:
    headers = {PEER_HEADER: peer_id} if peer_id else {}
    if auth_token:
        headers["Authorization"] = f"Bearer {auth_token}"
    return headers


class SourceError(Exception):
    """A source could not deliver (unreachable, HTTP error, stalled, truncated, too slow): the
    child moves to its next source. Not evidence of malice, so the source is not reported."""


class SourceGone(SourceError):
    """The source will never serve this version: it no longer holds it (HTTP 410) or skipped it
    because a newer one came first. Not asked again in later rounds; when every source is gone
    the fetch ends at once, so the worker moves on to the newest version instead of waiting."""


class SourceMisbehaved(SourceError):
    """A source sent something no honest relay sends (a chunk failing its sha256, an oversized or
    out-of-order frame): never retried for this version, and reported to the coordinator."""

    def __init__(self, message: str, *, reason: str, chunk_index: int, got_sha256: str = "") -> None:
        super().__init__(message)
        self.reason = reason
        self.chunk_index = chunk_index
        self.got_sha256 = got_sha256  # of the whole chunk it sent, when it sent one


class BroadcastFailed(Exception):
    """Every source failed; the worker keeps its previous version and reports the failure.
    `obsolete`: every source said it will never serve this version (a newer one superseded it),
    so asking again is pointless: the worker should ask the coordinator for the newest one."""

    def __init__(self, message: str, *, obsolete: bool = False) -> None:
        super().__init__(message)
        self.obsolete = obsolete


class FetchAborted(Exception):
    """This fetch's version was superseded by a newer one started on the same relay."""
