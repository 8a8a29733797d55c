"""Weight manifest: what a published policy version contains and how to verify it chunk by chunk.

A version's payload is one safetensors blob (or, with a base version, a delta against it). The
manifest lists the tensors (name, dtype, shape, byte range in the blob), the chunk size and the
sha256 of every chunk, so a receiver can verify each chunk as it arrives and never keep, forward
or load a byte that fails. The learner signs the encoded manifest (see `signing`); the codec
here is plain JSON, never pickle.
"""

from __future__ import annotations

import hashlib
import json
import re
import struct
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator

MANIFEST_FORMAT = 1
MAX_MANIFEST_BYTES = 64 << 20
"""Decode limit: 64 MiB holds ~900k chunk hashes (a 900 GB payload at 1 MiB chunks)."""
_SHA256_HEX = re.compile(r"[0-9a-f]{64}")


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

    @model_validator(mode="after")
    def _consistent(self) -> Manifest:
        expected = -(-self.total_bytes // self.chunk_bytes)
        if len(self.chunk_sha256) != expected:
            raise ValueError(
                f"chunk_sha256 has {len(self.chunk_sha256)} entries but {self.total_bytes} bytes in "
                f"chunks of {self.chunk_bytes} make {expected}"
            )
        bad = next((h for h in self.chunk_sha256 if not _SHA256_HEX.fullmatch(h)), None)
        if bad is not None:
            raise ValueError(f"chunk_sha256 entry {bad[:80]!r} is not 64 lowercase hex digits")
        for entry in self.tensors:
            if not entry.start <= entry.end <= self.total_bytes:
                raise ValueError(f"tensor {entry.name!r} byte range [{entry.start}, {entry.end}) is outside the payload")
        return self

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


def encode_manifest(manifest: Manifest) -> bytes:
    """Compact JSON bytes: what the learner signs and the coordinator forwards unchanged."""
    return manifest.model_dump_json().encode()


def decode_manifest(data: bytes | str, *, max_bytes: int = MAX_MANIFEST_BYTES) -> Manifest:
    """Parse and validate encoded manifest bytes; ValueError (never a partial object) otherwise."""
    if len(data) > max_bytes:
        raise ValueError(f"manifest is {len(data)} bytes, larger than the {max_bytes}-byte limit")
    try:
        return Manifest.model_validate_json(data)
    except ValidationError as exc:
        raise ValueError(f"invalid manifest: {exc.errors()[0]['msg']} at {exc.errors()[0]['loc']}") from None


class SignedManifest(BaseModel):
    """A manifest with the learner's signature over its exact bytes (see `signing`); a wire type,
    so it lives here, free of the cryptography the signing itself needs."""

    model_config = ConfigDict(frozen=True, extra="forbid")
    kind: Literal["signed_manifest"] = "signed_manifest"
    manifest_json: str
    """The encoded manifest exactly as signed; parse it with `verify_manifest`."""
    signature_hex: str
    key_id: str
    """Fingerprint of the signing key (see `key_id`), to name a key mismatch clearly."""

    def unverified_manifest(self) -> Manifest:
        """The manifest without checking the signature: for routing and logs only, never for data."""
        return decode_manifest(self.manifest_json)
