"""Fixture data the task tests write themselves: word problems with numeric and LaTeX answers
in the shapes real datasets use (a bare answer, a worked solution ending in `#### n`)."""

from __future__ import annotations

import json
import random
from pathlib import Path


def word_problems(count: int = 50, seed: int = 0) -> list[dict]:
    rng = random.Random(seed)
    rows = []
    for i in range(count):
        a, b = rng.randint(2, 40), rng.randint(2, 40)
        kind = i % 3
        if kind == 0:
            rows.append({"question": f"Sam has {a} apples and buys {b} more. How many apples does he have?",
                         "answer": str(a + b)})
        elif kind == 1:
            rows.append({"question": f"Split {a} cakes among {a * b} children equally. What share does each get?",
                         "answer": f"\\frac{{1}}{{{b}}}"})
        else:
            rows.append({"question": f"A box holds {a} pens; how many pens are in {b} boxes?",
                         "answer": f"Each box has {a} pens, so {b} boxes have {a} * {b} = {a * b}.\n#### {a * b}"})
    return rows


def write_jsonl(path: Path, rows: list[dict]) -> Path:
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


def write_parquet(path: Path, rows: list[dict]) -> Path:
    import pyarrow as pa
    import pyarrow.parquet as pq

    pq.write_table(pa.Table.from_pylist(rows), path)
    return path
