"""Live progress of a local run, read from the metrics file as it grows."""

from __future__ import annotations

import json
from pathlib import Path

from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

from echo2.config.run import RunConfig
from echo2.report.metrics import segment_path


class RunProgress:
    def __init__(self, cfg: RunConfig, console: Console) -> None:
        self.total = cfg.train.steps
        self.segment, self.offset = 0, 0  # where the next record is read (metrics.jsonl's segments)
        self.fields = {"reward": "-", "acc": "-", "stale": "-", "wait": "-"}
        self.progress = Progress(
            TextColumn("[bold]learner step"),
            BarColumn(),
            MofNCompleteColumn(),
            TextColumn("reward {task.fields[reward]}  held-out acc {task.fields[acc]}  "
                       "staleness max {task.fields[stale]}  wait {task.fields[wait]}s"),
            TimeElapsedColumn(),
            console=console,
        )
        self.task = self.progress.add_task("train", total=self.total, **self.fields)

    def __enter__(self) -> RunProgress:
        self.progress.start()
        return self

    def __exit__(self, *exc) -> None:
        self.progress.stop()

    def refresh_from(self, path: Path) -> None:
        """Apply the records written since the last call, following the file's segments."""
        while True:
            current, following = segment_path(path, self.segment), segment_path(path, self.segment + 1)
            if not current.is_file():
                return
            newer = following.is_file()  # looked at first: a line written after it may be missed, never twice
            self._read_from(current)
            if not newer:
                return
            self.segment, self.offset = self.segment + 1, 0

    def _read_from(self, segment: Path) -> None:
        with open(segment, "rb") as handle:
            handle.seek(self.offset)
            data = handle.read()
        complete = data[: data.rfind(b"\n") + 1]  # a line being written stays for next time
        self.offset += len(complete)
        for line in complete.splitlines():
            self._apply(json.loads(line))

    def _apply(self, record: dict) -> None:
        if record["role"] != "learner":
            return
        if record["kind"] == "train_step":
            self.fields.update(reward=f"{record['reward_mean']:.2f}", stale=str(record["staleness_max"]),
                               wait=f"{record['wait_s']:.2f}")
            self.progress.update(self.task, completed=record["step"] + 1, **self.fields)
        elif record["kind"] == "eval":
            self.fields["acc"] = f"{record['accuracy']:.3f}"
            self.progress.update(self.task, **self.fields)
        elif record["kind"] == "step_skipped":
            self.progress.console.print(f"learner step {record['step']} skipped ({record['reason']}): nothing "
                                        f"applied or published, batch handed back ({record['in_a_row']} in a row)")
