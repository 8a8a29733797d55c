"""The TensorBoard sink: scalars under their table tags, sample completions as a markdown table
(`tensorboard --logdir <run_dir>/tensorboard`)."""

from __future__ import annotations

import shutil
from pathlib import Path

from echo2.report.sinks import SAMPLE_COLUMNS, Sink


class TensorBoardSink(Sink):
    name = "tensorboard"

    def __init__(self, log_dir: Path) -> None:
        from torch.utils.tensorboard import SummaryWriter

        # derived from metrics.jsonl and replayed whole at each start: an old log would double it
        shutil.rmtree(log_dir, ignore_errors=True)
        self.writer = SummaryWriter(str(log_dir), flush_secs=10)

    def scalars(self, values: dict[str, float], step: int, time_s: float) -> None:
        for tag, value in values.items():
            self.writer.add_scalar(tag, value, step, walltime=time_s)

    def samples(self, rows: list[dict], step: int, time_s: float) -> None:
        self.writer.add_text("samples", samples_markdown(rows), step, walltime=time_s)

    def close(self) -> None:
        self.writer.close()


def samples_markdown(rows: list[dict]) -> str:
    columns = SAMPLE_COLUMNS[1:]
    lines = ["| " + " | ".join(columns) + " |", "|" + " --- |" * len(columns)]
    lines += ["| " + " | ".join(_cell(row[c]) for c in columns) + " |" for row in rows]
    return "\n".join(lines)


def _cell(value: object) -> str:
    text = f"{value:.3f}" if isinstance(value, float) else str(value)
    # a worker's text must not break the table: no column separators, no line breaks
    return text.replace("\\", "\\\\").replace("|", "\\|").replace("\r", " ").replace("\n", " ⏎ ")
