"""Weight manifest: what a published policy version contains and how to verify it chunk by chunk.

A version's payload is one safetensors blob (or, with a base version, a delta against it: see
echo2.broadcast.delta). The manifest lists the tensors (name, dtype, shape, byte range in the
blob), the chunk size and the sha256 of every chunk, so a receiver can verify each chunk as it
arrives and never keep, forward or load a byte that fails. A delta's chunks hash the delta, so
its manifest also carries the sha256 of every tensor of the reconstructed payload: a worker
verifies what it loads, not only what it received. The learner signs the encoded manifest (see
echo2.broadcast.signing); the codec here is plain JSON, never pickle.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import struct
from concurrent.futures import ThreadPoolExecutor
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator

MANIFEST_FORMAT = 2
MAX_MANIFEST_BYTES = 64 << 20
"""Decode limit: 64 MiB holds ~900k chunk hashes (a 900 GB payload at 1 MiB chunks)."""
_SHA256_HEX = re.compile(r"[0-9a-f]{64}")
FULL_CODEC = "safetensors"
DELTA_CODECS = ("sub-zstd", "xor-zstd")
"""How a delta payload encodes version v against v-1 (see echo2.broadcast.delta)."""
Codec = Literal["safetensors", "sub-zstd", "xor-zstd"]
Form = Literal["full", "delta"]
HASH_THREADS = min(8, os.cpu_count() or 1)
"""Tensors hashed at once: hashlib releases the GIL on large buffers, so a version's content
hash scales with cores (one core hashes ~1.5 GB/s: 11 s for a 16 GB version)."""


class TensorEntry(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")
    name: str
    dtype: str
    shape: list[int]
    start: int = Field(ge=0)
    """Byte offset of the tensor's data in the payload (safetensors header included before it)."""
    end: int = Field(ge=0)
    sha256: str | None = Field(None, pattern=r"^[0-9a-f]{64}$")
    """sha256 of the tensor's bytes in the payload a worker loads; required on delta manifests
    (checked after reconstruction), omitted on full ones (their chunk hashes cover every byte)."""


class AdapterSpec(BaseModel):
    """LoRA settings of an adapter-only version (grpo.lora): what a worker needs to add the same
    adapters to the base model it holds."""

    model_config = ConfigDict(frozen=True, extra="forbid", allow_inf_nan=False)
    r: int = Field(ge=1, le=4096)
    alpha: float = Field(gt=0)
    target_modules: list[str] = Field(min_length=1, max_length=64)


class Manifest(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")
    kind: Literal["manifest"] = "manifest"
    format: int = MANIFEST_FORMAT
    version: int = Field(ge=0)
    base_version: int | None = Field(None, ge=0)
    """None: a full snapshot. Otherwise the payload is a delta against this version."""
    codec: Codec = FULL_CODEC
    """"safetensors" for a full snapshot; a delta codec (see echo2.broadcast.delta) when
    base_version is set."""
    content_bytes: int = Field(0, ge=0)
    """Delta: the size of the reconstructed safetensors payload (0 on full manifests, whose
    payload is what they load)."""
    total_bytes: int = Field(ge=0)
    chunk_bytes: int = Field(ge=1)
    chunk_sha256: list[str]
    tensors: list[TensorEntry]
    published_at: float = 0.0
    """Learner wall clock at publish (for publish-to-loaded latency on one machine)."""
    adapter: AdapterSpec | None = None
    """Set when the payload holds LoRA adapter weights only: workers apply them to the base
    model they loaded at start. None: the payload is every weight of the model."""

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
        self._consistent_form()
        for entry in self.tensors:
            if not entry.start <= entry.end <= self.loaded_bytes:
                raise ValueError(f"tensor {entry.name!r} byte range [{entry.start}, {entry.end}) "
                                 "is outside the payload")
        return self

    def _consistent_form(self) -> None:
        if self.base_version is None:
            if self.codec != FULL_CODEC or self.content_bytes:
                raise ValueError(f"a full manifest has codec {FULL_CODEC!r} and no content_bytes (got {self.codec!r}, "
                                 f"{self.content_bytes})")
            return
        if self.codec not in DELTA_CODECS:
            raise ValueError(f"a delta manifest (base_version {self.base_version}) needs a delta codec "
                             f"{DELTA_CODECS}, got {self.codec!r}")
        if self.base_version >= self.version:
            raise ValueError(f"delta base_version {self.base_version} must be older than version {self.version}")
        if not self.tensors or any(entry.sha256 is None for entry in self.tensors):
            raise ValueError("a delta manifest lists every reconstructed tensor with its sha256")

    @property
    def form(self) -> Form:
        return "full" if self.base_version is None else "delta"

    @property
    def loaded_bytes(self) -> int:
        """Bytes of the safetensors payload a worker ends up loading."""
        return self.total_bytes if self.base_version is None else self.content_bytes

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


def safetensors_index(payload: bytes | memoryview) -> list[TensorEntry]:
    """Tensor index read from a safetensors header (8-byte little-endian length + JSON)."""
    if len(payload) < 8:
        raise ValueError("payload too short to be safetensors")
    (header_len,) = struct.unpack("<Q", payload[:8])
    if 8 + header_len > len(payload):
        raise ValueError(f"safetensors header length {header_len} exceeds payload size {len(payload)}")
    header = json.loads(bytes(payload[8 : 8 + header_len]))
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


def content_index(payload: bytes | memoryview) -> list[TensorEntry]:
    """The payload's tensor index with the sha256 of every tensor (hashed on HASH_THREADS)."""
    entries = safetensors_index(payload)
    view = memoryview(payload)
    with ThreadPoolExecutor(HASH_THREADS) as pool:
        digests = list(pool.map(lambda e: sha256_hex(view[e.start : e.end]), entries))
    return [e.model_copy(update={"sha256": digest}) for e, digest in zip(entries, digests, strict=True)]


def verify_content(manifest: Manifest, payload: bytes | memoryview) -> None:
    """Raise ValueError unless `payload` is exactly the content a delta manifest describes: its
    size, its tensor index, and the sha256 of every tensor (what a worker is about to load)."""
    if len(payload) != manifest.loaded_bytes:
        raise ValueError(f"version {manifest.version} reconstructs to {len(payload)} bytes, its manifest says "
                         f"{manifest.loaded_bytes}")
    found = content_index(payload)
    by_name = {e.name: e for e in found}
    for expected in manifest.tensors:
        got = by_name.get(expected.name)
        if got is None or got.model_copy(update={"sha256": None}) != expected.model_copy(update={"sha256": None}):
            raise ValueError(f"version {manifest.version}: tensor {expected.name!r} is laid out differently than its "
                             "manifest says")
        if expected.sha256 is not None and got.sha256 != expected.sha256:
            raise ValueError(f"version {manifest.version}: tensor {expected.name!r} fails its sha256 after "
                             f"reconstruction from base version {manifest.base_version}")
    if len(found) != len(manifest.tensors):
        raise ValueError(f"version {manifest.version} reconstructs to {len(found)} tensors, its manifest lists "
                         f"{len(manifest.tensors)}")


def build_manifest(
    version: int,
    payload: bytes,
    chunk_bytes: int,
    *,
    base_version: int | None = None,
    codec: Codec = FULL_CODEC,
    content: list[TensorEntry] | None = None,
    content_bytes: int = 0,
    published_at: float = 0.0,
    adapter: AdapterSpec | None = None,
) -> Manifest:
    """A full version's manifest, or (base_version set) a delta's: then `content` is the
    reconstructed payload's `content_index` and `content_bytes` its size."""
    view = memoryview(payload)
    return Manifest(
        version=version,
        base_version=base_version,
        codec=codec,
        content_bytes=content_bytes,
        total_bytes=len(payload),
        chunk_bytes=chunk_bytes,
        chunk_sha256=[sha256_hex(view[s:e]) for s, e in chunk_spans(len(payload), chunk_bytes)],
        tensors=safetensors_index(payload) if base_version is None else list(content or []),
        published_at=published_at,
        adapter=adapter,
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
    """A manifest with the learner's signature over its exact bytes (see echo2.broadcast.signing);
    a wire type, so it lives here, free of the cryptography the signing itself needs."""

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
