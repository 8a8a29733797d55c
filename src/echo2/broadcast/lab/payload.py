"""Synthetic version payloads: valid safetensors blobs of random bytes (no numpy, no torch)."""

from __future__ import annotations

import json
import os
import random
import struct

_HEADER_BYTES_PER_TENSOR = 128
"""Room reserved in the JSON header per tensor entry (a multiple of 8, as safetensors aligns)."""


def synthetic_payload(total_bytes: int, *, seed: int | None = None, tensors: int = 1) -> bytes:
    """A safetensors blob of exactly `total_bytes` holding `tensors` U8 tensors of random bytes
    (os.urandom, or a seeded generator for reproducible tests), so no chunk repeats by accident."""
    if tensors < 1:
        raise ValueError(f"tensors must be >= 1, got {tensors}")
    header_bytes = 64 + _HEADER_BYTES_PER_TENSOR * tensors
    body_bytes = total_bytes - 8 - header_bytes
    if body_bytes < tensors:
        raise ValueError(f"total_bytes {total_bytes} too small for {tensors} tensors; "
                         f"use >= {8 + header_bytes + tensors}")
    header, offset = {}, 0
    for i, size in enumerate(_split(body_bytes, tensors)):
        header[f"layer{i}.weight"] = {"dtype": "U8", "shape": [size], "data_offsets": [offset, offset + size]}
        offset += size
    raw = json.dumps(header).encode()
    raw += b" " * (header_bytes - len(raw))  # fixed header size: the blob is exactly total_bytes
    body = os.urandom(body_bytes) if seed is None else random.Random(seed).randbytes(body_bytes)
    return struct.pack("<Q", header_bytes) + raw + body


def _split(total: int, parts: int) -> list[int]:
    base, extra = divmod(total, parts)
    return [base + (1 if i < extra else 0) for i in range(parts)]
