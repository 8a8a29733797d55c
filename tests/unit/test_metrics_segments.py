"""metrics.jsonl split into size-bounded segments by several writers at once: nothing lost,
each writer's order kept, the summary over segments equal to the one over a single file, and
the launcher's live progress following the segments."""

from __future__ import annotations

import io
import json

from rich.console import Console
from tests.unit.metrics_fixtures import synthetic_run, write_run

from echo2.config.run import RunConfig
from echo2.launch.progress import RunProgress
from echo2.report.metrics import MetricsWriter, iter_metrics, metrics_segments, read_metrics
from echo2.report.summary import summarize


def test_small_segments_lose_nothing_and_keep_each_writers_order(tmp_path):
    path = tmp_path / "metrics.jsonl"
    writers = {role: MetricsWriter(path, role, segment_bytes=2048) for role in ("learner", "coordinator", "worker")}
    for seq in range(300):
        for writer in writers.values():
            writer.write("tick", seq=seq, pad="p" * (seq % 50))
    for writer in writers.values():
        writer.close()
    segments = metrics_segments(path)
    assert len(segments) > 20 and segments[1].name == "metrics.jsonl.1"
    longest = max(len(line) for s in segments for line in s.read_bytes().splitlines(keepends=True))
    assert all(s.stat().st_size <= 2048 + longest for s in segments)
    records = read_metrics(path)
    assert len(records) == 900
    for role in writers:
        assert [r["seq"] for r in records if r["role"] == role] == list(range(300))


def test_a_restarted_writer_appends_to_the_newest_segment(tmp_path):
    path = tmp_path / "metrics.jsonl"
    first = MetricsWriter(path, "learner", segment_bytes=256)
    for i in range(20):
        first.write("tick", i=i)
    first.close()
    newest = len(metrics_segments(path)) - 1
    again = MetricsWriter(path, "learner", segment_bytes=1 << 20)  # a resumed learner
    again.write("learner_resumed", step=5)
    again.close()
    assert len(metrics_segments(path)) == newest + 1
    assert [r["kind"] for r in read_metrics(path)][-1] == "learner_resumed"
    assert json.loads(metrics_segments(path)[-1].read_text().splitlines()[-1])["kind"] == "learner_resumed"


def test_the_summary_over_segments_equals_the_one_over_a_single_file(tmp_path):
    records = synthetic_run(steps=40, chatter_per_step=2)
    write_run(tmp_path / "split" / "metrics.jsonl", records, segment_bytes=4096)
    write_run(tmp_path / "whole" / "metrics.jsonl", records, segment_bytes=1 << 30)
    assert len(metrics_segments(tmp_path / "split" / "metrics.jsonl")) > 10
    assert len(metrics_segments(tmp_path / "whole" / "metrics.jsonl")) == 1
    split = summarize(iter_metrics(tmp_path / "split" / "metrics.jsonl"))
    assert split == summarize(iter_metrics(tmp_path / "whole" / "metrics.jsonl")) == summarize(records)
    assert split["steps"] == 40 and split["accuracy_after"] == 0.7 and split["tokens_per_s"]["w2"] == 102.0
    assert summarize(iter(records)) == split  # one pass over a one-shot iterator is enough


def test_live_progress_follows_the_segments(tmp_path):
    path = tmp_path / "metrics.jsonl"
    cfg = RunConfig.model_validate({"run_dir": str(tmp_path), "train": {"steps": 30}})
    learner = MetricsWriter(path, "learner", segment_bytes=512)
    with RunProgress(cfg, Console(file=io.StringIO())) as progress:
        for step in range(30):
            learner.write("train_step", step=step, reward_mean=0.5, staleness_max=0, wait_s=0.1)
            if step % 7 == 0:
                progress.refresh_from(path)
        progress.refresh_from(path)
        task = progress.progress.tasks[0]
    learner.close()
    assert len(metrics_segments(path)) > 5 and task.completed == 30
