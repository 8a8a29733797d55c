"""The provisioning plan on hand-computable catalogs: fleet choice, latencies, cost, baseline,
and the infeasibility diagnosis."""

import pytest

from echo2.config.base import validate
from echo2.config.catalog import PlanConfig
from echo2.planner.fleet import fleet_size_caps
from echo2.planner.plan import make_plan

CHUNK = 1_000_000  # 1 MB: 8 ms per hop at 1 Gbit/s


def _config(**changes) -> PlanConfig:
    """1 GB model (8 s per copy at 1 Gbit/s), B = 20, T_train = 10 s, S = 3, T_gen = 5 s without
    spread, so the p90 lateness is T_gen + 0.9 T_train (a step's leases spread over one step)."""
    data = {
        "learner": {"price_per_hour": 10.0, "uplink_bps": 1e9, "rollouts_per_s": 4.0},
        "workers": {"w": {"count": 10, "price_per_hour": 1.0, "rollouts_per_s": 1.0, "bandwidth_bps": 1e9}},
        "workload": {
            "params": 1e9,
            "bytes_per_param": 1,
            "prompts_per_step": 4,
            "group_size": 5,
            "step_time_s": 10,
            "max_staleness": 3,
            "generation_time_s": 5,
            "load_time_s": 2,
        },
        "broadcast": {"topology": "chain", "chunk_bytes": CHUNK, "hop_latency_s": 0.0},
        "plan": {"generation_cv": 0.0},
    }
    for dotted, value in changes.items():
        *path, key = dotted.split("__")
        node = data
        for part in path:
            node = node[part]
        node[key] = value
    return validate(PlanConfig, data)


def test_hand_computed_plan():
    plan = make_plan(_config())
    # B/T = 2/s; a swap (2 s) every version (10 s: the 8 s round fits a step) -> each worker
    # keeps 0.8/s -> 3 workers
    assert plan.feasible
    assert plan.base_rps == pytest.approx(2.0)
    assert plan.required_rps == pytest.approx(2.0 * 10 / 8)
    assert plan.n_workers == 3 and plan.fleet_price_per_hour == pytest.approx(3.0)
    assert plan.admissible_rps == pytest.approx(3 * 0.8)
    # chain to 3 workers: 8 s + 2 hops x 8 ms, plus 2 s load
    assert plan.dissemination_s == pytest.approx(8 + 2 * 0.008 + 2)
    assert plan.classes[0].tail_s == pytest.approx(5 + 9, abs=0.2)  # T_gen + p90 of U(0, 10 s)
    assert plan.s_min == 3  # ceil((10.016 + 14) / 10)
    assert plan.utilization == 1.0 and plan.step_wall_s == pytest.approx(10.0)
    assert plan.cost_per_step == pytest.approx(13 * 10 / 3600)
    assert plan.cost_per_rollout == pytest.approx(13 * 10 / 3600 / 20)
    # baseline: 10 s train + max(20/4, 5) s generation on the learner at $10/h
    assert plan.baseline.step_wall_s == pytest.approx(15.0)
    assert plan.baseline.cost_per_step == pytest.approx(10 * 15 / 3600)
    assert plan.saving_fraction == pytest.approx(1 - 130 / 150)
    assert plan.method == "milp" and plan.gap == 0


def test_foreground_fetch_stalls_for_the_whole_dissemination():
    plan = make_plan(_config(workload__background_fetch=False, workload__bytes_per_version=0.5e9))
    # stall = T_dis ~ 6.02 s of every 10 s version: ~0.4/s per worker -> 6 workers
    assert plan.n_workers == 6
    assert plan.required_rps == pytest.approx(2 * 10 / (10 - plan.dissemination_s))
    # the whole 1 GB (10 s with the load) stalls a worker for every 10 s version: nothing left
    assert not make_plan(_config(workload__background_fetch=False)).feasible


def test_cheaper_class_outside_the_window_is_not_chosen():
    slow_link = {"count": 50, "price_per_hour": 0.1, "rollouts_per_s": 1.0, "bandwidth_bps": 0.5e9}
    # 16 s transfer + 2 load, plus a 16 s round wait, a step of lease spread and 5 s of
    # generation: more than the 30 s window
    plan = make_plan(_config(workers__slow=slow_link))
    slow = next(c for c in plan.classes if c.name == "slow")
    assert slow.chosen == 0 and slow.admissible_rps == 0 and slow.s_min == 5
    assert slow.swap_interval_s == pytest.approx(16)  # the round outlasts a step: versions skipped
    wide = make_plan(_config(workers__slow=slow_link, workload__max_staleness=5))
    assert wide.to_dict()["chosen"] == {"slow": 3}


def test_one_to_many_latency_limits_the_fleet():
    # the learner sends each 1 GB copy at 1 Gbit/s: 8 s per worker, so N workers take 8N s
    plan = make_plan(_config(broadcast__topology="one_to_many", workload__max_staleness=8))
    assert plan.feasible and plan.n_workers == 3
    assert plan.dissemination_s == pytest.approx(8 * plan.n_workers + 2)
    # at S = 6 a third worker's copy pushes the fleet past the window; two are too few
    assert make_plan(_config(broadcast__topology="one_to_many", workload__max_staleness=6)).feasible is False


def test_overlap_infeasibility_says_why_and_what_fixes_it():
    plan = make_plan(_config(workload__max_staleness=1))
    assert not plan.feasible
    (reason,) = plan.reasons
    assert reason.startswith(
        "S=1 cannot hide 10 s of dissemination and 14 s of wait and generation (p90; T_gen 5 s) "
        "with a 10 s learner step"
    )
    assert "S_min=3" in reason
    assert plan.fixes[0] == "set workload.max_staleness=3 (the smallest S with a feasible plan)"
    assert any("learner step of at least 25 s" in fix for fix in plan.fixes)


def test_capacity_infeasibility_suggests_more_workers():
    plan = make_plan(_config(workers__w__count=2))
    assert not plan.feasible
    assert "cannot feed the learner: at most 1.6 admissible rollouts/s" in plan.reasons[0]
    assert any("workers.w.count=3" in fix for fix in plan.fixes)
    assert plan.n_workers == 2 and plan.utilization == pytest.approx(0.8)
    assert plan.step_wall_s == pytest.approx(10 / 0.8)


def test_nat_workers_need_relays():
    nat = {
        "count": 10,
        "price_per_hour": 0.5,
        "rollouts_per_s": 1.0,
        "bandwidth_bps": 1e9,
        "reachable": False,
    }
    cfg = _config(workers__w__count=0, workers__nat=nat)
    plan = make_plan(cfg)
    assert not plan.feasible and "behind NAT" in plan.reasons[0]
    assert make_plan(
        _config(
            workers__w__count=0,
            workers__nat=nat,
            broadcast__topology="one_to_many",
            workload__max_staleness=8,
        )
    ).feasible


def test_high_staleness_warns():
    assert make_plan(_config(workload__max_staleness=8)).warnings
    assert not make_plan(_config()).warnings


def test_fleet_size_grid():
    assert fleet_size_caps(0) == []
    assert fleet_size_caps(1) == [1]
    assert fleet_size_caps(10) == [1, 2, 4, 8, 10]


def test_measured_bytes_per_version_replace_the_parameter_estimate():
    # a run measured 1.5 GB per version: the chain takes 12 s, not 8 s
    plan = make_plan(_config(workload__bytes_per_version=1.5e9, workload__max_staleness=4))
    assert plan.snapshot_bytes == 1.5e9
    assert plan.dissemination_s == pytest.approx(12 + 2 * 0.008 + 2)
    assert make_plan(_config()).snapshot_bytes == 1e9
    # twice the bytes (fp32 on the wire): a 16 s round outlasts the step, so a version also
    # waits for its round; S = 3 no longer hides it
    assert make_plan(_config(workload__bytes_per_version=2e9)).s_min == 5
