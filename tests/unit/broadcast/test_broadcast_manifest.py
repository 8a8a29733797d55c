"""Chunking and manifest codec: property tests (hypothesis) and the verification guarantees."""

from __future__ import annotations

import json
import struct

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from echo2.broadcast.lab.payload import synthetic_payload
from echo2.protocol.manifest import (
    Manifest,
    build_manifest,
    chunk_spans,
    decode_manifest,
    encode_manifest,
    safetensors_index,
    verify_chunk,
    verify_payload,
)


@given(total=st.integers(0, 1 << 16), chunk=st.integers(1, 1 << 16))
def test_chunk_spans_tile_the_payload_exactly(total: int, chunk: int) -> None:
    spans = chunk_spans(total, chunk)
    assert len(spans) == -(-total // chunk)
    assert [s for s, _ in spans] == list(range(0, total, chunk))
    assert all(0 < e - s <= chunk for s, e in spans)
    assert all(a_end == b_start for (_, a_end), (b_start, _) in zip(spans, spans[1:], strict=False))
    assert (spans[-1][1] if spans else 0) == total


def test_chunk_spans_rejects_nonpositive_chunk() -> None:
    with pytest.raises(ValueError, match="chunk_bytes"):
        chunk_spans(10, 0)


blobs = st.tuples(st.integers(1000, 20_000), st.integers(1, 4), st.integers(0, 2**32 - 1))


@settings(max_examples=40, deadline=None)
@given(blob=blobs, chunk=st.integers(16, 4096), version=st.integers(0, 10**9))
def test_manifest_roundtrips_and_matches_payload(blob: tuple[int, int, int], chunk: int, version: int) -> None:
    size, tensors, seed = blob
    payload = synthetic_payload(size, seed=seed, tensors=tensors)
    manifest = build_manifest(version, payload, chunk, published_at=123.25)
    decoded = decode_manifest(encode_manifest(manifest))
    assert decoded == manifest
    assert encode_manifest(decoded) == encode_manifest(manifest)
    assert decoded.total_bytes == len(payload) and decoded.num_chunks == len(chunk_spans(len(payload), chunk))
    verify_payload(decoded, payload)
    # the tensor index points at the right bytes: contiguous, inside the payload, covering the data
    assert [t.name for t in decoded.tensors] == [f"layer{i}.weight" for i in range(tensors)]
    assert decoded.tensors[-1].end == len(payload)
    assert sum(t.end - t.start for t in decoded.tensors) == sum(t.shape[0] for t in decoded.tensors)


@settings(max_examples=40, deadline=None)
@given(seed=st.integers(0, 2**32 - 1), chunk=st.integers(16, 2048), data=st.data())
def test_any_flipped_byte_fails_exactly_its_chunk(seed: int, chunk: int, data: st.DataObject) -> None:
    payload = synthetic_payload(5000, seed=seed)
    manifest = build_manifest(1, payload, chunk)
    position = data.draw(st.integers(0, len(payload) - 1))
    bad = bytearray(payload)
    bad[position] ^= 1 + data.draw(st.integers(0, 254))
    index = position // chunk
    start, end = manifest.chunk_span(index)
    assert not verify_chunk(manifest, index, bytes(bad[start:end]))
    assert verify_chunk(manifest, index, payload[start:end])
    with pytest.raises(ValueError, match=f"chunk {index} "):
        verify_payload(manifest, bytes(bad))


def test_verify_chunk_rejects_wrong_length() -> None:
    payload = synthetic_payload(1000, seed=1)
    manifest = build_manifest(1, payload, 100)
    assert not verify_chunk(manifest, 0, payload[:100] + b"x")
    with pytest.raises(ValueError, match="bytes"):
        verify_payload(manifest, payload + b"x")


@given(junk=st.binary(max_size=200))
def test_decode_never_returns_a_partial_manifest(junk: bytes) -> None:
    try:
        manifest = decode_manifest(junk)
    except ValueError:
        return
    assert isinstance(manifest, Manifest)  # only if the junk happened to be a whole valid manifest


def _encoded(**changes: object) -> bytes:
    manifest = build_manifest(3, synthetic_payload(1000, seed=2), 256)
    data = json.loads(encode_manifest(manifest))
    data.update(changes)
    return json.dumps(data).encode()


@pytest.mark.parametrize(
    ("changes", "message"),
    [
        ({"chunk_sha256": ["0" * 64]}, "make 4"),
        ({"total_bytes": 10_000}, "make 40"),
        ({"chunk_sha256": ["Z" * 64] * 4}, "hex"),
        ({"unexpected": 1}, "Extra inputs"),
        ({"version": -1}, "greater than or equal"),
    ],
)
def test_decode_rejects_inconsistent_manifests(changes: dict[str, object], message: str) -> None:
    with pytest.raises(ValueError, match=message):
        decode_manifest(_encoded(**changes))


def test_decode_enforces_size_limit() -> None:
    with pytest.raises(ValueError, match="limit"):
        decode_manifest(b"{" + b" " * 100 + b"}", max_bytes=50)


def test_safetensors_index_rejects_lying_header() -> None:
    header = json.dumps({"w": {"dtype": "U8", "shape": [4], "data_offsets": [0, 4]}}).encode()
    with pytest.raises(ValueError, match="exceeds"):
        safetensors_index(struct.pack("<Q", len(header) + 100) + header + b"abcd")


@given(size=st.integers(1000, 5000), tensors=st.integers(1, 4))
def test_synthetic_payload_has_exactly_the_requested_size(size: int, tensors: int) -> None:
    assert len(synthetic_payload(size, seed=0, tensors=tensors)) == size
