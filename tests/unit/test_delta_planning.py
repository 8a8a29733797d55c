"""The planner and the simulator take measured bytes per version as M (a delta or a LoRA adapter
instead of the full version), and charge a worker with no version `join_bytes` (the full
version, with deltas) when it starts."""

from pathlib import Path

from tests.unit.test_planner_plan import _config

from echo2.config.sim import load_scenario
from echo2.planner.fleet import class_plans
from echo2.sim.simulator import simulate

QWEN3_8B = Path(__file__).resolve().parents[2] / "configs" / "sim" / "qwen3_8b.toml"
FULL = 16.38e9


def test_catch_up_bytes_are_the_missed_versions_or_a_fresh_start():
    work = _config(workload__bytes_per_version=5e7, workload__join_bytes=1e9).workload
    assert work.snapshot_bytes == 5e7 and work.newcomer_bytes == 1e9
    assert work.catch_up_bytes(1) == 5e7 and work.catch_up_bytes(3) == 1.5e8
    assert work.catch_up_bytes(40) == 1e9  # a fresh start is cheaper than 40 deltas
    assert work.catch_up_bytes(None) == 1e9
    plain = _config().workload  # full versions: every way costs one version
    assert plain.catch_up_bytes(None) == plain.catch_up_bytes(5) == plain.snapshot_bytes == 1e9


def test_the_planner_uses_the_measured_bytes_and_charges_rejoins_a_full_version():
    full = class_plans(_config(workers__w__mean_uptime_s=300.0), 4)[0]
    delta = class_plans(_config(workers__w__mean_uptime_s=300.0, workload__bytes_per_version=5e7,
                                workload__join_bytes=1e9), 4)[0]
    delta_free_join = class_plans(_config(workers__w__mean_uptime_s=300.0, workload__bytes_per_version=5e7), 4)[0]
    load_s = 2.0  # _config's T_load, part of both
    assert delta.dissemination_s - load_s < (full.dissemination_s - load_s) / 5  # M is the delta's bytes
    assert delta.availability < delta_free_join.availability  # a replacement fetches 1 GB, not 50 MB
    assert abs(delta.availability - full.availability) < abs(delta_free_join.availability - full.availability)


def test_the_simulator_sends_newcomers_the_full_version_and_deltas_after():
    steps = ["sim.steps=6", "sim.activation=all"]
    full = simulate(load_scenario(QWEN3_8B, steps))
    delta = simulate(load_scenario(QWEN3_8B, [*steps, f"workload.bytes_per_version={0.05 * FULL}",
                                              f"workload.join_bytes={FULL}"]))
    assert full.finished and delta.finished
    # the first round brings every worker the full version either way; later rounds carry deltas
    assert delta.first_wait_s > 0.9 * full.first_wait_s
    # (home links set the pace of a round, so 5% of the bytes is not 5% of the time)
    assert delta.round_latency_s["p50"] < full.round_latency_s["p50"] / 2 and delta.rounds > full.rounds
