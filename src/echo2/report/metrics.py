"""Metrics as JSON lines in `<run_dir>/metrics.jsonl`, one record per event, from every role.

Each record is written with a single O_APPEND write, so lines from concurrent processes on one
machine never interleave. Records carry `role`, `kind` and wall-clock `time`; tests and the run
summary read them back with `iter_metrics` / `read_metrics`.

The file is split by size into segments: `metrics.jsonl`, then `metrics.jsonl.1`, `.2`, ...
(higher is newer; nothing is deleted). Several processes append to the same file, so a segment
is never renamed: a writer whose segment is full, or that sees a newer one, moves on to the
newest, creating the next when none is newer. Each writer's records stay in its own order; at a
boundary two writers' records may land on either side of it (their `time` tells them apart).
"""

from __future__ import annotations

import json
import os
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

DEFAULT_SEGMENT_BYTES = 64 << 20


def segment_path(path: Path, index: int) -> Path:
    """Segment `index` of the metrics file at `path` (0 is `path` itself)."""
    return path if index == 0 else path.with_name(f"{path.name}.{index}")


def metrics_segments(path: Path) -> list[Path]:
    """The segments that exist, oldest first."""
    out: list[Path] = []
    while (segment := segment_path(path, len(out))).is_file():
        out.append(segment)
    return out


class MetricsWriter:
    def __init__(self, path: Path | None, role: str, segment_bytes: int = DEFAULT_SEGMENT_BYTES) -> None:
        self.role, self.path, self.segment_bytes = role, path, segment_bytes
        self.fd: int | None = None
        self.segment = 0
        if path is not None:
            path.parent.mkdir(parents=True, exist_ok=True)
            self._open(max(0, len(metrics_segments(path)) - 1))

    def write(self, kind: str, **values: Any) -> None:
        if self.fd is None:
            return
        record = {"time": time.time(), "role": self.role, "kind": kind, **values}
        line = (json.dumps(record, default=float) + "\n").encode()
        if self._segment_done():
            self._advance()
        os.write(self.fd, line)

    def close(self) -> None:
        if self.fd is not None:
            os.close(self.fd)
            self.fd = None

    def _segment_done(self) -> bool:
        assert self.fd is not None and self.path is not None
        # two cheap system calls a record: records are events (steps, leases), not tokens
        return (os.fstat(self.fd).st_size >= self.segment_bytes
                or segment_path(self.path, self.segment + 1).is_file())

    def _advance(self) -> None:
        """To the newest segment when another writer started one, else to a new one."""
        assert self.fd is not None and self.path is not None
        index = self.segment + 1
        while segment_path(self.path, index + 1).is_file():
            index += 1
        os.close(self.fd)
        self._open(index)

    def _open(self, index: int) -> None:
        assert self.path is not None
        # no O_EXCL: two writers that start the same segment at once both append to it
        self.fd = os.open(segment_path(self.path, index), os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
        self.segment = index


def iter_metrics(path: Path) -> Iterator[dict[str, Any]]:
    """Every record of every segment, oldest segment first, one line in memory at a time."""
    for segment in metrics_segments(path):
        with open(segment, encoding="utf-8") as handle:
            for line in handle:
                if line.strip():
                    yield json.loads(line)


class MetricsTail:
    """Reads the records appended since the last call, following the file's segments (for the
    launcher's live view and the coordinator's dashboard while the run writes).

    `kinds`: only records of these kinds are parsed (a line is matched on its `"kind": "..."`
    text first, so the others cost no JSON parsing). `max_bytes`: at most this much is read per
    call (the rest waits for the next), so catching up on a long run's file stays bounded in
    memory; a line longer than that is skipped."""

    def __init__(self, path: Path, kinds: frozenset[str] | None = None, max_bytes: int | None = None) -> None:
        self.path, self.max_bytes = path, max_bytes
        self.segment, self.offset = 0, 0  # where the next record is read
        self._skipping = False  # inside a line longer than max_bytes
        # MetricsWriter writes `"kind": "<kind>"` with json.dumps's default separators
        self._markers = None if kinds is None else [f'"kind": {json.dumps(k)}'.encode() for k in kinds]

    def read_new(self) -> list[dict[str, Any]]:
        out: list[dict[str, Any]] = []
        while True:
            current, following = segment_path(self.path, self.segment), segment_path(self.path, self.segment + 1)
            if not current.is_file():
                return out
            newer = following.is_file()  # looked at first: a line written after it may be missed, never twice
            records, at_end = self._read_from(current)
            out += records
            if not newer or not at_end:
                return out
            self.segment, self.offset = self.segment + 1, 0

    def _read_from(self, segment: Path) -> tuple[list[dict[str, Any]], bool]:
        """The complete lines from the offset on, and whether they reach the segment's end."""
        with open(segment, "rb") as handle:
            handle.seek(self.offset)
            data = handle.read() if self.max_bytes is None else handle.read(self.max_bytes + 1)
        limited = self.max_bytes is not None and len(data) > self.max_bytes
        data = data[: self.max_bytes] if limited else data
        if self._skipping:  # the rest of a line longer than max_bytes
            end = data.find(b"\n")
            self._skipping = end < 0
            self.offset += len(data) if end < 0 else end + 1
            return ([], not limited) if end < 0 else self._read_from(segment)
        complete = data[: data.rfind(b"\n") + 1]  # a line being written stays for next time
        if limited and not complete:
            self._skipping, self.offset = True, self.offset + len(data)
            return [], False
        self.offset += len(complete)
        lines = complete.splitlines()
        if self._markers is not None:
            lines = [line for line in lines if any(m in line for m in self._markers)]
        return [json.loads(line) for line in lines if line.strip()], not limited


def read_metrics(path: Path) -> list[dict[str, Any]]:
    """All records in a list: for tests and small runs; the summary streams `iter_metrics`."""
    return list(iter_metrics(path))
