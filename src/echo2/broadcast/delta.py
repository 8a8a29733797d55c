"""Lossless deltas between two versions of one model (bytes in, bytes out; numpy and zstandard,
no torch): version v is sent as its difference from v-1, and a worker holding v-1 rebuilds v
bit for bit.

At RL learning rates most bf16 weights round to the same value after a step (the fp32 master
moves by ~lr, a bf16 step is ~2^-8 of the weight), so the difference of two versions is mostly
zeros. Two exact schemes, measured side by side by `benchmarks/delta_bytes.py`:

- "sub-zstd" (default): the element-wise difference of the raw integers (a bf16 as its uint16
  bit pattern, modulo 2^16), zigzag-mapped so one step up or down is a small number. A change
  that carries into the exponent (0x3F7F -> 0x3F80) stays one small number, where XOR sets
  eight bits, so it compresses smaller than "xor-zstd" on bf16.
- "xor-zstd": the XOR of the bit patterns.

Either way the elements are split into byte planes (all low bytes, then all high bytes): the
high byte (sign, exponent) of a bf16 almost never changes, so zstd sees long zero runs.

Delta payload: `8-byte LE length | JSON header | zstd frames`. The header names the codec, the
reconstructed size and the blocks `[start, end, itemsize, frame_bytes]` that tile the data
section of the safetensors payload; blocks are (de)compressed in parallel. The safetensors
header section is not sent: a delta exists only between payloads with identical layouts
(`same_layout`), so the base's own header is the result's. The caller verifies the result
against the manifest's per-tensor hashes (`manifest.verify_content`).
"""

from __future__ import annotations

import json
import mmap
import struct
from concurrent.futures import ThreadPoolExecutor

import numpy as np
import zstandard

from echo2.protocol.manifest import DELTA_CODECS, HASH_THREADS, safetensors_index

BLOCK_BYTES = 16 << 20
"""Raw bytes per zstd frame: large enough for zstd's window to find the zero runs, small enough
that a 16 GB version splits into ~1000 frames for the thread pool."""
_ITEMSIZE = {"F64": 8, "I64": 8, "F32": 4, "I32": 4, "F16": 2, "BF16": 2, "I16": 2, "I8": 1, "U8": 1, "BOOL": 1}
MAX_HEADER_BYTES = 16 << 20
"""A delta header lists ~40 bytes per block: 16 MiB covers 6 TB of weights at BLOCK_BYTES."""


def header_bytes(payload: bytes | memoryview) -> int:
    """End of a safetensors payload's header section (where tensor data starts)."""
    if len(payload) < 8:
        raise ValueError("payload too short to be safetensors")
    (length,) = struct.unpack("<Q", payload[:8])
    return 8 + length


def same_layout(base: bytes | memoryview, new: bytes | memoryview) -> bool:
    """True when `new` can be sent as a delta against `base`: the same size and header (the
    same tensors, dtypes, shapes and offsets)."""
    if len(base) != len(new) or len(base) < 8:
        return False
    end = header_bytes(new)
    return end <= len(new) and bytes(memoryview(base)[:end]) == bytes(memoryview(new)[:end])


def encode_delta(base: bytes | memoryview, new: bytes | memoryview, *, codec: str = "sub-zstd",
                 level: int = 3) -> bytes:
    """The delta payload that rebuilds `new` from `base` (both safetensors, one layout)."""
    _check_codec(codec)
    if not same_layout(base, new):
        raise ValueError("base and new payloads differ in layout (tensors, dtypes or shapes): send a full version")
    blocks = _blocks(new)
    base_view, new_view = memoryview(base), memoryview(new)

    def encode(block: tuple[int, int, int]) -> bytes:
        start, end, itemsize = block
        planes = _planes(_difference(_array(base_view, start, end, itemsize), _array(new_view, start, end, itemsize),
                                     codec), itemsize)
        return zstandard.ZstdCompressor(level=level).compress(planes)

    with ThreadPoolExecutor(HASH_THREADS) as pool:
        frames = list(pool.map(encode, blocks))
    header = json.dumps({
        "codec": codec, "total_bytes": len(new),
        "blocks": [[s, e, k, len(f)] for (s, e, k), f in zip(blocks, frames, strict=True)],
    }, separators=(",", ":")).encode()
    return b"".join([struct.pack("<Q", len(header)), header, *frames])


def decode_delta(base: bytes | memoryview, delta: bytes | memoryview, *, codec: str) -> memoryview:
    """The payload `delta` rebuilds from `base`, in fresh anonymous memory. Raises ValueError
    on a delta that does not fit `base` or is malformed; the caller still checks the result
    against the manifest's tensor hashes (a delta applied to the wrong base decodes fine)."""
    _check_codec(codec)
    base_view, delta_view = memoryview(base), memoryview(delta)
    blocks, frames_at = _parse_header(delta_view, codec, len(base_view), header_bytes(base_view))
    out = mmap.mmap(-1, len(base_view))
    out_view = memoryview(out)
    start0 = header_bytes(base_view)
    out_view[:start0] = base_view[:start0]
    offsets = np.cumsum([frames_at] + [b[3] for b in blocks]).tolist()

    def decode(index: int) -> None:
        start, end, itemsize, frame_bytes = blocks[index]
        frame = delta_view[offsets[index] : offsets[index] + frame_bytes]
        try:
            raw = zstandard.ZstdDecompressor().decompress(frame, max_output_size=end - start)
        except zstandard.ZstdError as exc:
            raise ValueError(f"delta block {index} does not decompress: {exc}") from None
        if len(raw) != end - start:
            raise ValueError(f"delta block {index} decompresses to {len(raw)} bytes, expected {end - start}")
        target = np.frombuffer(out, dtype=_dtype(itemsize), count=(end - start) // itemsize, offset=start)
        _apply(_array(base_view, start, end, itemsize), _unplanes(raw, itemsize), codec, target)

    with ThreadPoolExecutor(HASH_THREADS) as pool:
        list(pool.map(decode, range(len(blocks))))
    return out_view.toreadonly()


def _check_codec(codec: str) -> None:
    if codec not in DELTA_CODECS:
        raise ValueError(f"delta codec {codec!r} is unknown (allowed: {', '.join(DELTA_CODECS)})")


def _blocks(payload: bytes | memoryview) -> list[tuple[int, int, int]]:
    """[start, end, itemsize) blocks tiling the data section: runs of tensors with one element
    size (the layout puts the widest first, so a bf16 model is one run), cut at BLOCK_BYTES."""
    runs: list[list[int]] = []
    position = header_bytes(payload)
    for entry in safetensors_index(payload):
        itemsize = _ITEMSIZE.get(entry.dtype, 1)
        if entry.start > position:  # padding between tensors: plain bytes
            runs.append([position, entry.start, 1])
        if runs and runs[-1][2] == itemsize and runs[-1][1] == entry.start:
            runs[-1][1] = entry.end
        elif entry.end > entry.start:
            runs.append([entry.start, entry.end, itemsize])
        position = max(position, entry.end)
    if position < len(payload):
        runs.append([position, len(payload), 1])
    blocks = []
    for start, end, itemsize in runs:
        size = itemsize if (end - start) % itemsize == 0 else 1  # never drop a ragged tail
        # BLOCK_BYTES is a multiple of every itemsize: each block holds whole elements
        blocks += [(s, min(s + BLOCK_BYTES, end), size) for s in range(start, end, BLOCK_BYTES)]
    return blocks


def _dtype(itemsize: int) -> np.dtype:
    return np.dtype(f"<u{itemsize}")


def _array(view: memoryview, start: int, end: int, itemsize: int) -> np.ndarray:
    return np.frombuffer(view, dtype=_dtype(itemsize), count=(end - start) // itemsize, offset=start)


def _difference(base: np.ndarray, new: np.ndarray, codec: str) -> np.ndarray:
    if codec == "xor-zstd":
        return base ^ new
    signed = (new - base).view(f"<i{base.itemsize}")  # unsigned subtraction wraps: exact mod 2^bits
    return ((signed << 1) ^ (signed >> (8 * base.itemsize - 1))).view(base.dtype)  # zigzag


def _apply(base: np.ndarray, diff: np.ndarray, codec: str, out: np.ndarray) -> None:
    if codec == "xor-zstd":
        np.bitwise_xor(base, diff, out=out)
        return
    sign = (diff & 1).view(f"<i{diff.itemsize}")
    np.negative(sign, out=sign)  # 0 or all ones
    np.right_shift(diff, 1, out=diff)
    np.bitwise_xor(diff, sign.view(diff.dtype), out=diff)  # un-zigzag in place
    np.add(base, diff, out=out)  # mod 2^bits


def _planes(values: np.ndarray, itemsize: int) -> bytes:
    return values.view(np.uint8).reshape(-1, itemsize).T.tobytes()


def _unplanes(raw: bytes, itemsize: int) -> np.ndarray:
    # shift and OR the planes together (contiguous passes): copying the transposed planes back
    # into elements is several times slower and would be most of a rebuild's time
    planes = np.frombuffer(raw, dtype=np.uint8).reshape(itemsize, -1)
    values = planes[itemsize - 1].astype(_dtype(itemsize))
    for plane in planes[itemsize - 2 :: -1] if itemsize > 1 else ():
        values <<= 8
        values |= plane
    return values


def _parse_header(delta: memoryview, codec: str, base_bytes: int, data_start: int) -> tuple[list[list[int]], int]:
    """The blocks of a delta payload and where its frames start, validated against the base."""
    if len(delta) < 8:
        raise ValueError("delta payload too short")
    (length,) = struct.unpack("<Q", delta[:8])
    if length > min(MAX_HEADER_BYTES, len(delta) - 8):
        raise ValueError(f"delta header length {length} exceeds the payload or the {MAX_HEADER_BYTES}-byte limit")
    try:
        header = json.loads(bytes(delta[8 : 8 + length]))
        blocks = [[int(x) for x in block] for block in header["blocks"]]
        total, named = int(header["total_bytes"]), str(header["codec"])
    except (ValueError, KeyError, TypeError) as exc:
        raise ValueError(f"delta header is malformed: {exc!r}"[:300]) from None
    if named != codec:
        raise ValueError(f"delta payload says codec {named!r}, its manifest {codec!r}")
    if total != base_bytes:
        raise ValueError(f"delta rebuilds a {total}-byte payload but the base holds {base_bytes} bytes: wrong base")
    position, frames = data_start, 0
    for index, block in enumerate(blocks):
        if len(block) != 4:
            raise ValueError(f"delta block {index} has {len(block)} fields, expected 4")
        start, end, itemsize, frame_bytes = block
        if (start != position or end <= start or itemsize not in (1, 2, 4, 8) or (end - start) % itemsize
                or frame_bytes < 0):
            raise ValueError(f"delta block {index} {block} does not continue the data section at {position}")
        position, frames = end, frames + frame_bytes
    if position != total or 8 + length + frames != len(delta):
        raise ValueError(f"delta blocks cover up to byte {position} of {total} with {frames} frame bytes; "
                         f"the payload has {len(delta) - 8 - length}")
    return blocks, 8 + length
