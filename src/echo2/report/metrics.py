"""Metrics as JSON lines in `<run_dir>/metrics.jsonl`, one record per event, from every role.

Each record is written with a single O_APPEND write, so lines from concurrent processes on one
machine never interleave. Records carry `role`, `kind` and wall-clock `time`; tests and the run
summary read them back with `read_metrics`.
"""

from __future__ import annotations

import json
import os
import time
from pathlib import Path
from typing import Any


class MetricsWriter:
    def __init__(self, path: Path | None, role: str) -> None:
        self.role = role
        self.fd: int | None = None
        if path is not None:
            path.parent.mkdir(parents=True, exist_ok=True)
            self.fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)

    def write(self, kind: str, **values: Any) -> None:
        if self.fd is None:
            return
        record = {"time": time.time(), "role": self.role, "kind": kind, **values}
        os.write(self.fd, (json.dumps(record, default=float) + "\n").encode())

    def close(self) -> None:
        if self.fd is not None:
            os.close(self.fd)
            self.fd = None


def read_metrics(path: Path) -> list[dict[str, Any]]:
    if not path.is_file():
        return []
    records = []
    for line in path.read_text().splitlines():
        if line.strip():
            records.append(json.loads(line))
    return records
