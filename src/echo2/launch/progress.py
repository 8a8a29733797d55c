"""Live progress of a local run, read from the metrics file as it grows."""

from __future__ import annotations

from pathlib import Path

from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

from echo2.config.run import RunConfig
from echo2.report.metrics import MetricsTail


class RunProgress:
    def __init__(self, cfg: RunConfig, console: Console) -> None:
        self.total = cfg.train.steps
        self.tail: MetricsTail | None = None
        self.fields = {"reward": "-", "acc": "-", "stale": "-", "wait": "-", "booting": ""}
        self.progress = Progress(
            TextColumn("[bold]learner step"),
            BarColumn(),
            MofNCompleteColumn(),
            TextColumn("reward {task.fields[reward]}  held-out acc {task.fields[acc]}  "
                       "staleness max {task.fields[stale]}  wait {task.fields[wait]}s{task.fields[booting]}"),
            TimeElapsedColumn(),
            console=console,
        )
        self.task = self.progress.add_task("train", total=self.total, **self.fields)

    def __enter__(self) -> RunProgress:
        self.progress.start()
        return self

    def __exit__(self, *exc) -> None:
        self.progress.stop()

    def show_booting(self, booting: dict[str, float]) -> None:
        """A remote fleet's machines acquired and not registered yet: how many, the longest wait."""
        text = (f"  booting {len(booting)} (longest {max(booting.values()):.0f} s: {max(booting, key=booting.get)})"
                if booting else "")
        if text != self.fields["booting"]:
            self.fields["booting"] = text
            self.progress.update(self.task, **self.fields)

    def refresh_from(self, path: Path) -> None:
        """Apply the records written since the last call."""
        if self.tail is None or self.tail.path != path:
            self.tail = MetricsTail(path)
        for record in self.tail.read_new():
            self._apply(record)

    def _apply(self, record: dict) -> None:
        if record["kind"] == "eval" and record["role"] in ("learner", "coordinator"):  # coordinator: on workers
            self.fields["acc"] = f"{record['accuracy']:.3f} (v{record['step']})"
            self.progress.update(self.task, **self.fields)
            return
        if record["role"] != "learner":
            return
        if record["kind"] == "train_step":
            self.fields.update(reward=f"{record['reward_mean']:.2f}", stale=str(record["staleness_max"]),
                               wait=f"{record['wait_s']:.2f}")
            self.progress.update(self.task, completed=record["step"] + 1, **self.fields)
        elif record["kind"] == "step_skipped":
            self.progress.console.print(f"learner step {record['step']} skipped ({record['reason']}): nothing "
                                        f"applied or published, batch handed back ({record['in_a_row']} in a row)")
