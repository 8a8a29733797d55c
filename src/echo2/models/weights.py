"""Policy weights in the safetensors layout, written tensor by tensor (no pickle ever crosses a
process boundary, and no second full copy of the model is built on the way).

A payload is `8-byte header length | JSON header | tensor data`, exactly what
`safetensors.torch.save` writes, so any safetensors reader loads it. The learner writes each
tensor, cast to the wire dtype and moved off the GPU, straight into the buffer the broadcast
serves (or into a checkpoint file); workers read tensors as zero-copy views of the verified
payload. Tied parameters (embeddings shared with the LM head) travel once.
"""

from __future__ import annotations

import json
import mmap
import os
import struct
import warnings
from dataclasses import dataclass
from pathlib import Path

import torch

# safetensors' dtype names; what a payload may hold
_ST_NAMES = {
    torch.float64: "F64", torch.float32: "F32", torch.float16: "F16", torch.bfloat16: "BF16",
    torch.int64: "I64", torch.int32: "I32", torch.int16: "I16", torch.int8: "I8", torch.uint8: "U8",
    torch.bool: "BOOL",
}
_ST_DTYPES = {name: dtype for dtype, name in _ST_NAMES.items()}


@dataclass(frozen=True)
class Entry:
    name: str
    tensor: torch.Tensor
    dtype: torch.dtype
    start: int
    """Byte offset of the tensor's data in the whole payload (header included before it)."""
    end: int


@dataclass(frozen=True)
class Layout:
    header: bytes
    """Length prefix and JSON header, padded to 8 bytes as safetensors does."""
    entries: list[Entry]

    @property
    def total_bytes(self) -> int:
        return self.entries[-1].end if self.entries else len(self.header)


def unique_tensors(model: torch.nn.Module) -> dict[str, torch.Tensor]:
    """The model's state dict with tied aliases left out (the first name of each storage wins)."""
    seen: set[int] = set()
    unique: dict[str, torch.Tensor] = {}
    for name, tensor in model.state_dict().items():
        ptr = tensor.untyped_storage().data_ptr()
        if ptr in seen:
            continue
        seen.add(ptr)
        unique[name] = tensor.detach()
    return unique


def plan_layout(tensors: dict[str, torch.Tensor], float_dtype: torch.dtype | None = None) -> Layout:
    """Where each tensor goes; floating tensors are cast to `float_dtype` (None: kept as is)."""
    typed = []
    for name, tensor in tensors.items():
        dtype = float_dtype if float_dtype is not None and tensor.is_floating_point() else tensor.dtype
        if dtype not in _ST_NAMES:
            raise ValueError(f"tensor {name}: dtype {dtype} cannot be published "
                             f"(allowed: {sorted(map(str, _ST_NAMES))})")
        typed.append((name, tensor, dtype))
    # widest elements first, as safetensors does: every tensor starts aligned to its element size
    typed.sort(key=lambda item: -item[2].itemsize)
    header: dict[str, dict] = {}
    offset = 0
    placed = []
    for name, tensor, dtype in typed:
        size = tensor.numel() * dtype.itemsize
        header[name] = {"dtype": _ST_NAMES[dtype], "shape": list(tensor.shape), "data_offsets": [offset, offset + size]}
        placed.append((name, tensor, dtype, offset, offset + size))
        offset += size
    text = json.dumps(header, separators=(",", ":")).encode()
    text += b" " * (-len(text) % 8)  # safetensors aligns the data section to 8 bytes
    prefix = struct.pack("<Q", len(text)) + text
    base = len(prefix)
    entries = [Entry(n, t, d, base + s, base + e) for n, t, d, s, e in placed]
    return Layout(header=prefix, entries=entries)


def write_payload(layout: Layout, out: memoryview | mmap.mmap) -> None:
    """Fill `out` (layout.total_bytes long, writable) tensor by tensor: each is cast and copied
    from wherever it lives (GPU included) into its slot, with no other full-model buffer."""
    view = memoryview(out)
    view[: len(layout.header)] = layout.header
    for entry in layout.entries:
        if entry.end == entry.start:
            continue
        slot = torch.frombuffer(view, dtype=torch.uint8, count=entry.end - entry.start, offset=entry.start)
        slot.view(entry.dtype).view(entry.tensor.shape).copy_(entry.tensor)


def model_payload(model: torch.nn.Module, float_dtype: torch.dtype | None = None) -> mmap.mmap:
    """The model's weights as one safetensors payload in anonymous memory (what the learner
    publishes); `float_dtype` is the wire dtype."""
    return tensors_payload(unique_tensors(model), float_dtype)


def tensors_payload(tensors: dict[str, torch.Tensor], float_dtype: torch.dtype | None = None) -> mmap.mmap:
    """The same from named tensors (a sharded learner's gathered full state dict)."""
    layout = plan_layout(tensors, float_dtype)
    buffer = mmap.mmap(-1, layout.total_bytes)
    write_payload(layout, buffer)
    return buffer


def save_model_file(model: torch.nn.Module, path: Path, float_dtype: torch.dtype | None = None) -> int:
    """Write the model's weights to a safetensors file through a memory map of the file (tensor
    by tensor, flushed before returning); returns the bytes written."""
    layout = plan_layout(unique_tensors(model), float_dtype)
    with open(path, "w+b") as handle:
        handle.truncate(layout.total_bytes)
        with mmap.mmap(handle.fileno(), layout.total_bytes) as mapped:
            write_payload(layout, mapped)
            mapped.flush()
        os.fsync(handle.fileno())
    return layout.total_bytes


def payload_tensors(payload: memoryview | bytes) -> dict[str, torch.Tensor]:
    """Read-only tensors viewing a safetensors payload in place (no copy). The payload must
    outlive them; the caller copies them into a model (`load_into`)."""
    view = memoryview(payload)
    if len(view) < 8:
        raise ValueError("payload too short to be safetensors")
    (header_len,) = struct.unpack("<Q", view[:8])
    base = 8 + header_len
    if base > len(view):
        raise ValueError(f"safetensors header length {header_len} exceeds payload size {len(view)}")
    header = json.loads(bytes(view[8:base]))
    tensors = {}
    with warnings.catch_warnings():
        # the verified payload is read-only on purpose; these views are only ever read
        warnings.filterwarnings("ignore", message="The given buffer is not writable")
        for name, meta in header.items():
            if name == "__metadata__":
                continue
            tensors[name] = _view_tensor(view, base, name, meta)
    return tensors


def _view_tensor(view: memoryview, base: int, name: str, meta: dict) -> torch.Tensor:
    dtype = _ST_DTYPES.get(meta.get("dtype"))
    if dtype is None:
        raise ValueError(f"tensor {name}: unsupported dtype {meta.get('dtype')!r}")
    shape = [int(d) for d in meta["shape"]]
    start, end = (int(x) for x in meta["data_offsets"])
    numel = 1
    for d in shape:
        numel *= d
    if not 0 <= start <= end <= len(view) - base or end - start != numel * dtype.itemsize:
        raise ValueError(f"tensor {name}: data_offsets {[start, end]} do not fit shape {shape} of {meta['dtype']}")
    if numel == 0:
        return torch.empty(shape, dtype=dtype)
    flat = torch.frombuffer(view, dtype=torch.uint8, count=end - start, offset=base + start)
    return flat.view(dtype).view(shape)


def load_into(model: torch.nn.Module, tensors: dict[str, torch.Tensor]) -> None:
    """Copy tensors into the model in place, cast to the model's own dtype and device; refuse
    payloads that do not match it.

    Names may be missing only for tied aliases, which are filled through the tensor they share.
    """
    own = model.state_dict()
    unexpected = sorted(set(tensors) - set(own))
    if unexpected:
        raise ValueError(f"weights do not match the model: unexpected tensors {unexpected[:3]}")
    present = {own[name].untyped_storage().data_ptr() for name in tensors}
    missing = [n for n in own if n not in tensors and own[n].untyped_storage().data_ptr() not in present]
    if missing:
        raise ValueError(f"weights do not match the model: missing tensors {missing[:3]}")
    with torch.no_grad():
        for name, tensor in tensors.items():
            if own[name].shape != tensor.shape:
                raise ValueError(f"tensor {name}: shape {tuple(tensor.shape)} != model's {tuple(own[name].shape)}")
            own[name].copy_(tensor)


def nonfinite_tensors(named: dict[str, torch.Tensor]) -> list[str]:
    """Names of floating tensors holding a NaN or an infinity."""
    return [name for name, t in named.items() if t.is_floating_point() and not bool(torch.isfinite(t).all())]


class NonFiniteError(RuntimeError):
    """Weights or optimizer state hold NaN or infinity: never signed, published or saved."""


def require_finite(named: dict[str, torch.Tensor], what: str) -> None:
    bad = nonfinite_tensors(named)
    if bad:
        raise NonFiniteError(f"{what}: {len(bad)} tensor(s) hold NaN or infinity ({', '.join(bad[:3])}); "
                             "refusing to write it")
