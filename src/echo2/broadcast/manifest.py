"""Weight manifest: what a published policy version contains and how to verify it chunk by chunk.

A version's payload is one safetensors blob. The manifest lists the tensors (name, dtype,
shape, byte range in the blob), the chunk size and the sha256 of every chunk, so a receiver
can verify each chunk as it arrives and never keep, forward or load a byte that fails.
"""

from __future__ import annotations

import hashlib
import json
import struct
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field

MANIFEST_FORMAT = 1


class TensorEntry(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")
    name: str
    dtype: str
    shape: list[int]
    start: int = Field(ge=0)
    """Byte offset of the tensor's data in the payload (safetensors header included before it)."""
    end: int = Field(ge=0)


class Manifest(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")
    kind: Literal["manifest"] = "manifest"
    format: int = MANIFEST_FORMAT
    version: int = Field(ge=0)
    base_version: int | None = None
    """None: a full snapshot. Otherwise the payload is a delta against this version."""
    total_bytes: int = Field(ge=0)
    chunk_bytes: int = Field(ge=1)
    chunk_sha256: list[str]
    tensors: list[TensorEntry]
    published_at: float = 0.0
    """Learner wall clock at publish (for publish-to-loaded latency on one machine)."""

    @property
    def num_chunks(self) -> int:
        return len(self.chunk_sha256)

    def chunk_span(self, index: int) -> tuple[int, int]:
        start = index * self.chunk_bytes
        return start, min(start + self.chunk_bytes, self.total_bytes)


def chunk_spans(total_bytes: int, chunk_bytes: int) -> list[tuple[int, int]]:
    """Byte ranges [start, end) of consecutive chunks covering total_bytes (the last may be short)."""
    if chunk_bytes < 1:
        raise ValueError(f"chunk_bytes must be >= 1, got {chunk_bytes}")
    return [(s, min(s + chunk_bytes, total_bytes)) for s in range(0, total_bytes, chunk_bytes)]


def sha256_hex(data: bytes | memoryview) -> str:
    return hashlib.sha256(data).hexdigest()


def safetensors_index(payload: bytes) -> list[TensorEntry]:
    """Tensor index read from a safetensors header (8-byte little-endian length + JSON)."""
    if len(payload) < 8:
        raise ValueError("payload too short to be safetensors")
    (header_len,) = struct.unpack("<Q", payload[:8])
    if 8 + header_len > len(payload):
        raise ValueError(f"safetensors header length {header_len} exceeds payload size {len(payload)}")
    header = json.loads(payload[8 : 8 + header_len])
    base = 8 + header_len
    entries = [
        TensorEntry(
            name=name,
            dtype=meta["dtype"],
            shape=list(meta["shape"]),
            start=base + meta["data_offsets"][0],
            end=base + meta["data_offsets"][1],
        )
        for name, meta in header.items()
        if name != "__metadata__"
    ]
    return sorted(entries, key=lambda e: e.start)


def build_manifest(
    version: int,
    payload: bytes,
    chunk_bytes: int,
    *,
    base_version: int | None = None,
    published_at: float = 0.0,
) -> Manifest:
    view = memoryview(payload)
    return Manifest(
        version=version,
        base_version=base_version,
        total_bytes=len(payload),
        chunk_bytes=chunk_bytes,
        chunk_sha256=[sha256_hex(view[s:e]) for s, e in chunk_spans(len(payload), chunk_bytes)],
        tensors=safetensors_index(payload) if base_version is None else [],
        published_at=published_at,
    )


def verify_chunk(manifest: Manifest, index: int, data: bytes | memoryview) -> bool:
    start, end = manifest.chunk_span(index)
    return len(data) == end - start and sha256_hex(data) == manifest.chunk_sha256[index]


def verify_payload(manifest: Manifest, payload: bytes) -> None:
    """Raise ValueError naming the first chunk that does not match the manifest."""
    if len(payload) != manifest.total_bytes:
        raise ValueError(f"payload has {len(payload)} bytes, manifest says {manifest.total_bytes}")
    view = memoryview(payload)
    for index in range(manifest.num_chunks):
        start, end = manifest.chunk_span(index)
        if not verify_chunk(manifest, index, view[start:end]):
            raise ValueError(f"chunk {index} of version {manifest.version} fails its sha256")
