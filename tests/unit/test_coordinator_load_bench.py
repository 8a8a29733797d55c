"""The coordinator load benchmark (benchmarks/coordinator_load.py) kept from rotting: its simulated
workers and fake learner speak the real protocol to a real coordinator app on loopback (the
state machine and HTTP face in this process, scoring inline) for a few seconds, and everything
they do is accepted and measured; the pieces the report is computed with are checked on
numbers worked by hand."""

from __future__ import annotations

import asyncio
import sys
import time
from dataclasses import replace
from pathlib import Path

from aiohttp import web
from tests.unit.coordinator_helpers import make_state

from echo2.coordinator.http.server import build_app
from echo2.coordinator.parts.credentials import Secrets
from echo2.report.metrics import MetricsWriter

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "benchmarks"))

from load import report  # noqa: E402
from load.answers import AnswerBook  # noqa: E402
from load.case_report import RECOVERY_WINDOW_S  # noqa: E402
from load.client import run_workers  # noqa: E402
from load.fake_learner import FakeLearner  # noqa: E402
from load.scenarios import CaseSettings, plan_case, source_ip  # noqa: E402
from load.sim_worker import SimSettings, SimWorker  # noqa: E402
from load.stats import Histogram, Merged, Recorder  # noqa: E402

JOIN, LEARNER, OPERATOR = "bench-join-0123456789", "bench-learner-0123456789", "bench-operator-0123456789"
RUN_S = 4.0


async def _coordinator(tmp_path: Path, model_dir: Path) -> tuple[web.AppRunner, str]:
    state = make_state(tmp_path, model_dir, time.monotonic, max_staleness=1, groups_per_step=2)
    app = build_app(state, MetricsWriter(tmp_path / "metrics.jsonl", "coordinator"),
                    Secrets(join=JOIN, learner=LEARNER, operator=OPERATOR), max_request_bytes=1 << 20)
    runner = web.AppRunner(app)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    return runner, f"http://127.0.0.1:{runner.addresses[0][1]}"


async def _fleet_against_coordinator(tmp_path: Path, model_dir: Path) -> tuple[Recorder, FakeLearner]:
    runner, url = await _coordinator(tmp_path, model_dir)
    recorder = Recorder([("measure", 0.0)])
    learner = FakeLearner(url, LEARNER, (model_dir / "model.safetensors").read_bytes(), train_s=0.05,
                          chunk_bytes=64 << 10, checkpoint_every=50, recorder=recorder)
    settings = SimSettings(url=url, join_token=JOIN, gen_s=(0.05, 0.1), fetch_s=(0.01, 0.05))
    answers = AnswerBook(model_dir / "tokenizer.json")
    stop = asyncio.Event()
    try:
        jobs = [asyncio.create_task(learner.run(stop))]
        jobs += [asyncio.create_task(SimWorker(i, f"sim{i}", source_ip(i), settings, recorder=recorder,
                                               answers=answers).run(stop)) for i in range(3)]
        await asyncio.sleep(RUN_S)
        stop.set()
        await asyncio.wait_for(asyncio.gather(*jobs), timeout=15)
    finally:
        await runner.cleanup()
    return recorder, learner


def test_simulated_fleet_speaks_the_protocol_to_a_real_coordinator(tmp_path, tiny_model_dir):
    recorder, learner = asyncio.run(_fleet_against_coordinator(tmp_path, tiny_model_dir))
    merged = Merged()
    merged.add(recorder.to_dict())
    phases = ("measure",)
    assert merged.count("registered", phases) == 3
    assert merged.count("rollout_accepted", phases) > 0  # well-formed groups, scored and buffered
    assert merged.count("rollout_refused", phases) == 0
    assert learner.steps >= 1  # batches came from the simulated workers' groups
    errors = report.errors_section(merged, phases)
    assert errors == {}, errors  # nothing refused, timed out or failed
    latency = report.latency_section(merged, report.WORKER_KINDS + report.LEARNER_KINDS, phases)
    for kind in ("register", "heartbeat", "lease", "rollout", "leave", "batch", "publish"):
        assert latency[kind]["count"] > 0, kind
    assert latency["leave"]["count"] == 3


async def _leaving_at_their_own_times(tmp_path: Path, model_dir: Path) -> Recorder:
    runner, url = await _coordinator(tmp_path, model_dir)
    now = time.time()
    recorder = Recorder([("early", 0.0), ("late", now + 1.8)])
    cfg = {"url": url, "join_token": JOIN, "tokenizer": str(model_dir / "tokenizer.json"), "settings": {},
           "workers": [[0, "sim0", source_ip(0), now, now + 1.0], [1, "sim1", source_ip(1), now, now + 2.6]]}
    try:
        bugs = await asyncio.wait_for(run_workers(cfg, recorder, asyncio.Event()), timeout=20)
    finally:
        await runner.cleanup()
    assert bugs == []
    return recorder


def test_a_client_process_sends_each_leave_at_its_workers_own_time(tmp_path, tiny_model_dir):
    merged = Merged()
    merged.add(asyncio.run(_leaving_at_their_own_times(tmp_path, tiny_model_dir)).to_dict())
    assert merged.count("registered", ("early",)) == 2
    assert merged.histogram("leave", ("early",)).summary()["count"] == 1  # sim0, at +1.0 s
    assert merged.histogram("leave", ("late",)).summary()["count"] == 1  # sim1, at +2.6 s, still working until then
    assert report.errors_section(merged, ("early", "late")) == {}


def test_answer_book_gives_the_sum_as_token_ids(tiny_model_dir):
    answers = AnswerBook(tiny_model_dir / "tokenizer.json")
    prompt = answers.tokenizer.encode("37+45=", add_special_tokens=False).ids
    assert answers.tokenizer.decode(answers.answer(prompt)) == "82"


def test_histogram_percentiles_within_one_percent_and_merge():
    first, second = Histogram(), Histogram()
    for ms in range(1, 501):
        first.add(float(ms))
    for ms in range(501, 1001):
        second.add(float(ms))
    first.merge(Histogram.from_dict(second.to_dict()))
    assert first.n == 1000 and first.max_ms == 1000.0
    assert abs(first.percentile(0.5) - 500) / 500 < 0.01
    assert abs(first.percentile(0.99) - 990) / 990 < 0.01


def test_recorder_files_by_the_phase_a_request_started_in():
    recorder = Recorder([("join", 100.0), ("measure", 200.0), ("leave", 300.0)])
    recorder.took("lease", 250.0, 5.0)
    recorder.outcome("lease", "http_429", 50.0, reason="too many registrations from 127.0.0.1: retry in 2.5 s")
    assert [key for key in recorder.latency] == [("measure", "lease")]
    assert list(recorder.outcomes) == [("join", "lease", "http_429")]
    assert next(iter(recorder.reasons))[2] == "too many registrations from #.#.#.#: retry in #.# s"


def test_recovery_is_when_the_pace_is_back_for_good():
    steps = [float(t) for t in range(0, 60)] + [75.0 + t for t in range(0, 45)]  # 1 step/s, a 15 s gap at 60
    recovered, slowest = report.recovery_s(steps, joined_at=60.0, end=119.0, before_per_min=60.0, window_s=10.0)
    assert recovered == 24.0  # the first trailing 10 s window back at 60 steps/min ends at 84
    assert slowest == 0.0
    unharmed, _ = report.recovery_s([float(t) for t in range(120)], 60.0, 119.0, before_per_min=60.0, window_s=10.0)
    assert unharmed == 0.0


def test_a_pace_within_the_tolerance_counts_as_recovered_over_the_benchmarks_window():
    """A step a second, then 3% slower from the join (a step every 1.03 s), within the 5%
    tolerance: over RECOVERY_WINDOW_S it never left full pace; over 10 s windows, which hold
    9 or 10 steps (54 or 60/min), it seems to fall behind whenever a window holds 9."""
    steps = [float(t) for t in range(60)] + [60.0 + 1.03 * i for i in range(58)]
    assert report.recovery_s(steps, 60.0, 119.0, before_per_min=60.0, window_s=RECOVERY_WINDOW_S)[0] == 0.0
    ten_s_verdict, slowest = report.recovery_s(steps, 60.0, 119.0, before_per_min=60.0, window_s=10.0)
    assert slowest == 54.0 and (ten_s_verdict is None or ten_s_verdict >= 30.0)


def test_plan_spreads_joins_and_leaves_and_mass_join_lands_within_a_second():
    settings = CaseSettings(config="", overrides=(), duration_s=60, warmup_s=10, ramp_s=None, leave_s=None,
                            before_s=30, base_workers=100, train_s=1.0, sim={}, workers_per_client=2000,
                            workers_per_address=1, coordinator_cores=frozenset({0}), client_cores=frozenset({1}),
                            runs_root=Path("."))
    steady = plan_case(settings, "steady", 1000, now=0.0)
    assert steady.notes["ramp_s"] == 10.0 and steady.window[1] - steady.window[0] == 60
    assert max(steady.join_at) < steady.window[0]
    leaves = steady.leave_times()  # after the measured window, at the pace of the joins, in join order
    assert min(leaves) == steady.window[1] == steady.leave_at and leaves == sorted(leaves)
    assert steady.last_leave_at - max(leaves) < 0.011 and steady.leave_s == steady.notes["leave_s"] == 10.0
    at_once = plan_case(replace(settings, leave_s=0.0), "steady", 1000, now=0.0)
    assert set(at_once.leave_times()) == {at_once.leave_at} == {at_once.last_leave_at}
    mass = plan_case(settings, "mass_join", 1000, now=0.0)
    joined = mass.join_at[100:]
    assert len(joined) == 1000 and max(joined) - min(joined) < 1.0 and min(joined) == mass.window[0]
    assert len({source_ip(i) for i in range(20000)}) == 20000


def test_a_saved_result_does_not_make_the_measured_tree_dirty(tmp_path):
    """A benchmark run in parts saves its first part's result before the next part starts:
    only code counts as a change, or no second part could ever join the first."""
    import subprocess

    from load.provenance import dirty

    def git(*args: str) -> None:
        subprocess.run(["git", *args], cwd=tmp_path, check=True, capture_output=True, timeout=30)

    (tmp_path / "benchmarks" / "results").mkdir(parents=True)
    (tmp_path / "src").mkdir()
    for path in ("benchmarks/results/load.json", "src/code.py"):
        (tmp_path / path).write_text("1\n")
    git("init", "-q")
    git("add", "-A")
    git("-c", "user.name=t", "-c", "user.email=t@t", "commit", "-qm", "start")
    (tmp_path / "benchmarks" / "results" / "load.json").write_text("2\n")
    assert not dirty(tmp_path)
    (tmp_path / "src" / "code.py").write_text("2\n")
    assert dirty(tmp_path)


def test_save_writes_each_scenario_to_its_own_result():
    """A mass join saved with --save once replaced the steady cases' coordinator_load.json."""
    import coordinator_load

    steady = coordinator_load.saved_path(coordinator_load.parse_args(["--save"]))
    mass = coordinator_load.saved_path(coordinator_load.parse_args(["--mass-join", "--save"]))
    assert steady.name == "coordinator_load.json" and mass.name == "coordinator_load_mass_join.json"
