"""Synthetic version payloads: valid safetensors blobs of random bytes (no numpy, no torch)."""

from __future__ import annotations

import json
import os
import random
import struct


def synthetic_payload(total_bytes: int, *, seed: int | None = None, tensors: int = 1) -> bytes:
    """A safetensors blob of about `total_bytes` (header included) holding `tensors` U8 tensors.

    Random content (os.urandom, or a seeded generator for reproducible tests) so no chunk hash
    repeats by accident."""
    sizes = _split(max(0, total_bytes - 256), tensors)
    header, offset = {}, 0
    for i, size in enumerate(sizes):
        header[f"layer{i}.weight"] = {"dtype": "U8", "shape": [size], "data_offsets": [offset, offset + size]}
        offset += size
    raw = json.dumps(header).encode()
    raw += b" " * (-len(raw) % 8)  # safetensors pads the header to 8 bytes
    body = os.urandom(offset) if seed is None else random.Random(seed).randbytes(offset)
    return struct.pack("<Q", len(raw)) + raw + body


def _split(total: int, parts: int) -> list[int]:
    if parts < 1:
        raise ValueError(f"tensors must be >= 1, got {parts}")
    base, extra = divmod(total, parts)
    return [base + (1 if i < extra else 0) for i in range(parts)]
