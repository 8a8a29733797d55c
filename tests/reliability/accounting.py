"""Where every prompt of a finished run went, from its metrics and the coordinator's store:
trained (once), dropped as stale, retired by the learner, or still queued, leased or buffered at
the end. A prompt handed out and none of these is lost. Used by the reliability tests and
benchmarks/chaos.py."""

from __future__ import annotations

import json
import sqlite3
from pathlib import Path

from echo2.report.metrics import read_metrics


def accounting(run_dir: Path, max_staleness: int) -> dict:
    rows = read_metrics(run_dir / "metrics.jsonl")
    steps = {r["step"]: r for r in rows if r["kind"] == "train_step"}  # a replayed step counts once
    trained = [p for r in steps.values() for p in r["prompt_indices"]]
    dropped = {p for r in rows if r["kind"] == "groups_dropped" for p in r["prompt_indices"]}
    retired = {p for r in rows if r["kind"] == "batch_rejected" for p in r.get("retired_prompt_indices", [])}
    db = sqlite3.connect(f"file:{run_dir / 'coordinator.db'}?mode=ro", uri=True)
    try:
        cursor = json.loads(db.execute("SELECT value FROM meta WHERE key='cursor'").fetchone()[0])
        pending = {r[0] for r in db.execute("SELECT prompt_index FROM pending")}
        buffered = {json.loads(r[0])["prompt_index"]
                    for r in db.execute("SELECT payload FROM groups WHERE state='buffered'")}
        # groups the store retired untrained (stale, rejected, quarantined): on record there even
        # when a kill came between its commit and the metrics line
        dropped |= {json.loads(r[0])["prompt_index"] for r in db.execute(
            "SELECT payload FROM groups WHERE state IN ('dropped', 'rejected', 'quarantined')")}
    finally:
        db.close()
    lost = sorted(set(range(cursor)) - (set(trained) | dropped | retired | pending | buffered))
    staleness = max((int(k) for r in steps.values() for k in r["staleness_hist"]), default=0)
    return {
        "prompts_handed_out": cursor, "prompts_trained": len(trained), "prompts_dropped_stale": len(dropped),
        "prompts_retired": len(retired), "prompts_queued_or_buffered_at_end": len(pending | buffered),
        "rollouts_lost": len(lost), "lost_prompts": lost[:20], "duplicates": len(trained) - len(set(trained)),
        "max_staleness": staleness, "max_staleness_allowed": max_staleness, "steps_trained": len(steps),
    }


def assert_sound(books: dict, steps: int) -> None:
    """Nothing lost, nothing trained twice, staleness within S, every step trained."""
    assert books["steps_trained"] == steps, books
    assert books["rollouts_lost"] == 0, books
    assert books["duplicates"] == 0, books
    assert books["max_staleness"] <= books["max_staleness_allowed"], books
