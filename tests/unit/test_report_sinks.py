"""The metric sinks, fed from metrics.jsonl records as `echo2 run` and `echo2 report --follow`
feed them: TensorBoard event files read back with TensorBoard's own reader, a W&B offline run
read back from its .wandb log (no account, no network, no process left behind), a failing sink
dropped without stopping the feed, and the scalar table over every record kind it maps."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator
from tests.unit.report_fixtures import report_run

from echo2.config.run import RunConfig
from echo2.report.scalars import SCALARS, scalars_of
from echo2.report.sink_factory import make_sinks
from echo2.report.sinks import SinkFeeder
from echo2.report.tensorboard_sink import TensorBoardSink, samples_markdown


def _by_kind(records: list[dict], kind: str) -> list[dict]:
    return [r for r in records if r["kind"] == kind]


def test_tensorboard_holds_the_runs_scalars_and_samples(tmp_path):
    records = report_run(steps=12)
    (tmp_path / "tb").mkdir()
    (tmp_path / "tb" / "events.out.tfevents.stale").write_bytes(b"an earlier session's log")
    feeder = SinkFeeder([TensorBoardSink(tmp_path / "tb")])
    feeder.feed(records)
    feeder.close()
    assert not (tmp_path / "tb" / "events.out.tfevents.stale").exists()  # replayed whole, not doubled

    events = EventAccumulator(str(tmp_path / "tb"), size_guidance={"scalars": 0, "tensors": 0})
    events.Reload()
    tags = set(events.Tags()["scalars"])
    assert {"train/reward_mean", "train/loss", "train/mismatch_kl", "train/clip_frac", "staleness/max",
            "staleness/mean", "learner/utilization", "learner/wait_s", "eval/accuracy", "queue/queued",
            "workers/active", "cost/total_usd", "cost/usd_per_hour", "broadcast/learner_copies_per_version",
            "activation/active_workers", "dissemination/publish_to_loaded_s/w0",
            "dissemination/publish_to_loaded_s/w2", "broadcast/relayed_bytes/w1"} <= tags
    steps = _by_kind(records, "train_step")
    reward = events.Scalars("train/reward_mean")
    assert [e.step for e in reward] == [s["step"] + 1 for s in steps]
    assert [e.value for e in reward] == pytest.approx([s["reward_mean"] for s in steps], rel=1e-6)
    assert [e.wall_time for e in reward] == pytest.approx([s["time"] for s in steps])
    utilization = events.Scalars("learner/utilization")[3].value
    s = steps[3]
    assert utilization == pytest.approx((s["train_s"] + s["publish_s"]) / (s["train_s"] + s["publish_s"] + s["wait_s"]))
    accuracy = events.Scalars("eval/accuracy")
    assert [e.step for e in accuracy] == [0, 12] and [e.value for e in accuracy] == pytest.approx([0.3, 0.7])
    loaded = [r for r in _by_kind(records, "weights_loaded") if r["worker_id"] == "w2"]
    latency = events.Scalars("dissemination/publish_to_loaded_s/w2")
    assert [e.step for e in latency] == [r["version"] for r in loaded]
    assert [e.value for e in latency] == pytest.approx([r["publish_to_loaded_s"] for r in loaded])
    assert events.Scalars("cost/total_usd")[-1].value == pytest.approx(0.11)
    text = events.Tensors("samples/text_summary")
    assert [e.step for e in text] == [1, 6, 11]  # logged beside the train_step of the same step
    assert "7\\|0 ⏎ end" in text[0].tensor_proto.string_val[0].decode()  # a worker's text cannot break the table


def _history(path: Path) -> list[dict]:
    """The logged rows of a .wandb file: a 7-byte header, then a LevelDB-style log (32 KiB
    blocks; each record a 4-byte CRC, a 2-byte length, a 1-byte type: 1 full, 2 first, 3 middle,
    4 last) of protobuf Records (W&B's reader moved into its Go service, so the test reads it)."""
    from wandb.proto import wandb_internal_pb2 as pb

    data, block = path.read_bytes(), 32768
    assert data[:4] == b":W&B"
    pos, pending, rows = 7, b"", []
    while pos + 7 <= len(data):
        if block - pos % block < 7:  # a block's tail too short for a header is padding
            pos += block - pos % block
            continue
        length, kind = int.from_bytes(data[pos + 4:pos + 6], "little"), data[pos + 6]
        pending += data[pos + 7:pos + 7 + length]
        pos += 7 + length
        if kind in (1, 4):
            record = pb.Record()
            record.ParseFromString(pending)
            pending = b""
            if record.WhichOneof("record_type") == "history":
                rows.append({item.key or "/".join(item.nested_key): json.loads(item.value_json)
                             for item in record.history.item})
    return rows


def _children() -> set[int]:
    me = str(os.getpid())
    out = set()
    for entry in Path("/proc").iterdir():
        try:
            if entry.name.isdigit() and (entry / "stat").read_text().rsplit(")", 1)[1].split()[1] == me:
                out.add(int(entry.name))
        except (OSError, IndexError):
            pass  # gone while we looked
    return out


def test_wandb_offline_run_holds_the_runs_scalars_and_leaves_no_process(tmp_path, monkeypatch):
    monkeypatch.setenv("WANDB_MODE", "offline")
    monkeypatch.setenv("WANDB_SILENT", "true")
    monkeypatch.setenv("WANDB_DIR", str(tmp_path / "wandb-home"))  # nothing outside the test's dirs
    monkeypatch.setenv("WANDB_CONFIG_DIR", str(tmp_path / "wandb-config"))
    monkeypatch.setenv("WANDB_CACHE_DIR", str(tmp_path / "wandb-cache"))
    before = _children()
    cfg = RunConfig.model_validate({"run_dir": str(tmp_path / "run"),
                                    "report": {"tensorboard": False, "wandb": {"enabled": True, "project": "t"}}})
    records = report_run(steps=6)
    feeder = SinkFeeder(make_sinks(cfg))
    assert [s.name for s in feeder.sinks] == ["wandb"]
    feeder.feed(records)
    feeder.close()

    runs = list((tmp_path / "run" / "wandb").glob("offline-run-*"))
    assert len(runs) == 1
    logs = list(runs[0].glob("run-*.wandb"))
    assert len(logs) == 1 and logs[0].stat().st_size > 0
    rows = _history(logs[0])
    steps = _by_kind(records, "train_step")
    rewards = [row for row in rows if "train/reward_mean" in row]
    assert [row["learner/steps_done"] for row in rewards] == [s["step"] + 1 for s in steps]
    assert [row["train/reward_mean"] for row in rewards] == pytest.approx([s["reward_mean"] for s in steps])
    assert any(row.get("cost/total_usd") == pytest.approx(0.05) for row in rows)
    tables = [row for row in rows if row.get("samples/_type") == "table-file"]
    assert [row["learner/steps_done"] for row in tables] == [1, 6]  # beside the train_step of the same step
    table = json.loads((runs[0] / "files" / tables[0]["samples/path"]).read_text())
    assert table["columns"] == ["step", "prompt", "completion", "reward", "worker_id", "version"]
    assert table["data"] == [[1, "3+4=", "7|0\nend", 1.0, "w0", 0]]
    assert _children() <= before  # W&B's service process ended with the run


class _Broken(TensorBoardSink):
    name = "broken"

    def __init__(self) -> None:
        self.calls = 0

    def scalars(self, values, step, time_s) -> None:
        self.calls += 1
        raise OSError("disk full")

    def close(self) -> None:
        pass


class _Recorder(_Broken):
    name = "recorder"

    def __init__(self) -> None:
        super().__init__()
        self.seen: list[tuple[int, dict]] = []
        self.rows: list[list[dict]] = []

    def scalars(self, values, step, time_s) -> None:
        self.seen.append((step, values))

    def samples(self, rows, step, time_s) -> None:
        self.rows.append(rows)


def test_a_failing_sink_is_dropped_with_one_warning_and_the_others_go_on():
    broken, recorder, warnings = _Broken(), _Recorder(), []
    feeder = SinkFeeder([broken, recorder], warn=warnings.append)
    records = report_run(steps=4)
    feeder.feed(records)
    assert broken.calls == 1 and feeder.sinks == [recorder]
    assert len(warnings) == 1 and "broken" in warnings[0] and "disk full" in warnings[0]
    assert len(recorder.seen) == sum(1 for r in records if scalars_of(r) is not None)
    # a record the table cannot read is skipped, and said once
    feeder.feed([{"time": 1.0, "role": "learner", "kind": "eval", "step": 3},
                 {"time": 1.0, "role": "learner", "kind": "samples", "step": 3, "samples": [{"prompt": "x"}]}])
    assert feeder.unreadable == 2 and len(warnings) == 2 and recorder.rows and len(recorder.rows) == 1


def test_records_without_a_step_take_the_newest_step_seen():
    recorder = _Recorder()
    feeder = SinkFeeder([recorder])
    feeder.feed([{"time": 1.0, "role": "learner", "kind": "train_step", "step": 6, "reward_mean": 0.5, "loss": 0.1,
                  "staleness_hist": {"0": 1}, "staleness_max": 0, "wait_s": 0.0, "train_s": 0.1, "publish_s": 0.0},
                 {"time": 2.0, "role": "coordinator", "kind": "activation", "active": ["w0", "w1"], "reason": "x",
                  "required_rps": None}])
    assert recorder.seen[-1] == (7, {"activation/active_workers": 2.0})  # required_rps unknown: left out


def test_the_scalar_table_maps_every_kind_of_the_synthetic_run():
    records = report_run(steps=6)
    mapped = {(r["role"], r["kind"]) for r in records if scalars_of(r) is not None}
    assert {("learner", "train_step"), ("learner", "eval"), ("learner", "checkpoint"), ("learner", "origin_bytes"),
            ("learner", "version_published"), ("worker", "weights_loaded"), ("coordinator", "coordinator_stats"),
            ("coordinator", "activation")} == mapped
    assert ("coordinator", "version_published") not in SCALARS  # the learner's record says it with bytes
    assert "| 1.000 |" in samples_markdown([{"prompt": "p", "completion": "c", "reward": 1.0, "worker_id": "w",
                                             "version": 2}])


def test_wandb_online_without_an_account_is_a_clear_config_error(tmp_path, monkeypatch):
    import wandb

    monkeypatch.delenv("WANDB_API_KEY", raising=False)
    monkeypatch.delenv("WANDB_MODE", raising=False)
    monkeypatch.setenv("HOME", str(tmp_path / "home"))  # no ~/.netrc login either
    monkeypatch.setenv("WANDB_CONFIG_DIR", str(tmp_path / "wandb-config"))
    monkeypatch.setenv("WANDB_SILENT", "true")
    cfg = RunConfig.model_validate({"run_dir": str(tmp_path / "run"), "report": {"wandb": {"enabled": True,
                                                                                          "mode": "online"}}})
    try:
        with pytest.raises(ValueError, match=r"report.wandb: .*WANDB_API_KEY.*mode='offline'"):
            make_sinks(cfg)
    finally:
        wandb.teardown()
