"""The dashboard's history of a run: the metrics file read in bounded slices of the kinds it
needs, across segments; curves that stay bounded on long runs and follow a resumed learner."""

from __future__ import annotations

from echo2.coordinator.http.history import MAX_POINTS, Curve, RunHistory
from echo2.report.metrics import MetricsTail, MetricsWriter, metrics_segments


def test_tail_reads_bounded_slices_of_the_wanted_kinds_across_segments(tmp_path):
    path = tmp_path / "metrics.jsonl"
    writer = MetricsWriter(path, role="learner", segment_bytes=2_000)
    for i in range(200):
        writer.write("train_step" if i % 3 == 0 else "lease_requeued", i=i, pad="x" * 20)
        if i == 100:  # one line longer than a slice: skipped whole, the rest still read
            writer.write("train_step", i=-1, pad="y" * 5_000)
    writer.close()
    assert len(metrics_segments(path)) > 5
    tail = MetricsTail(path, kinds=frozenset({"train_step"}), max_bytes=1_000)
    first = tail.read_new()
    assert 0 < len(first) < 10  # one slice: a few of the 1,000 bytes' lines were wanted
    seen = first + [r for _ in range(100) for r in tail.read_new()]
    assert [r["i"] for r in seen] == list(range(0, 200, 3))
    assert {r["kind"] for r in seen} == {"train_step"}


def test_tail_without_limits_reads_everything_at_once(tmp_path):
    path = tmp_path / "metrics.jsonl"
    writer = MetricsWriter(path, role="coordinator", segment_bytes=500)
    for i in range(50):
        writer.write("a" if i % 2 else "b", i=i)
    tail = MetricsTail(path)
    assert [r["i"] for r in tail.read_new()] == list(range(50))
    writer.write("a", i=50)
    writer.close()
    assert [r["i"] for r in tail.read_new()] == [50]


def test_curve_stays_bounded_and_evenly_thinned():
    curve = Curve()
    for step in range(20_000):
        curve.add(step, step * 0.5)
    shown = curve.shown()
    assert MAX_POINTS <= len(shown) <= 2 * MAX_POINTS + 1
    assert shown[0] == (0, 0.0) and shown[-1] == (19_999, 19_999 * 0.5)
    gaps = {b[0] - a[0] for a, b in zip(shown[:-2], shown[1:-1], strict=True)}
    assert gaps == {curve.stride}


def test_curve_follows_a_resumed_learner_and_leaves_out_nan():
    curve = Curve()
    for step in range(10):
        curve.add(step, float(step))
    curve.add(6, 60.0)  # resumed from a checkpoint at step 6: steps 6.. are trained again
    curve.add(7, float("nan"))
    assert curve.shown() == [(s, float(s)) for s in range(6)] + [(6, 60.0)]


def test_history_keeps_the_last_decisions_and_skips_unreadable_records():
    history = RunHistory(None)
    history.apply([{"role": "coordinator", "kind": "activation", "time": float(i), "active": ["w0"], "reason": "r",
                    "trigger": "", "changed": True, "required_rps": None} for i in range(50)])
    history.apply([{"role": "learner", "kind": "train_step", "step": 0},  # no reward: skipped, not fatal
                   {"role": "learner", "kind": "eval", "step": 3, "accuracy": 0.5},
                   {"role": "worker", "kind": "eval", "step": 4, "accuracy": 1.0}])  # only the learner's count
    assert [d["time"] for d in history.decisions] == [float(i) for i in range(30, 50)]
    assert history.accuracy.shown() == [(3, 0.5)] and history.reward.shown() == []
