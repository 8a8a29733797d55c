"""The activation controller at 10,000 workers: `decide` and `account` take one pass over the
workers each and rank only the probation slots, and they decide exactly as the controller
before them (kept in tests/unit/controller_reference.py) on random fleets, configs and event
sequences, with and without an activation catalog. Timings are benchmarks/policy_scale.py's."""

from __future__ import annotations

import math
import random

from hypothesis import given, settings
from hypothesis import strategies as st
from tests.unit import controller_reference as reference

from echo2.config.activation import ActivationConfig
from echo2.config.catalog import PlanConfig
from echo2.policy.controller import ActivationController

CLASSES = ["cheap", "dear", None, "unknown"]


def catalog() -> PlanConfig:
    """B = 4 x 4 every 10 s: 1.6 rollouts/s; cheap workers give 1/s each, dear ones 1/s at 3x."""
    return PlanConfig.model_validate({
        "learner": {"price_per_hour": 10.0, "uplink_bps": 1e9},
        "workers": {"cheap": {"count": 10, "price_per_hour": 0.3, "rollouts_per_s": 1.0, "bandwidth_bps": 1e9},
                    "dear": {"count": 4, "price_per_hour": 0.9, "rollouts_per_s": 1.0, "bandwidth_bps": 1e9}},
        "workload": {"params": 1e8, "prompts_per_step": 4, "group_size": 4, "step_time_s": 10.0,
                     "max_staleness": 3, "generation_time_s": 8.0, "load_time_s": 0.5},
    })


activation_configs = st.builds(
    ActivationConfig,
    enabled=st.sampled_from([True, True, True, False]),
    headroom=st.sampled_from([1.0, 1.15, 2.0]),
    margin=st.sampled_from([0.0, 0.1, 0.5]),
    min_samples=st.integers(1, 3),
    probation_slots=st.integers(0, 6),
    probation_timeout_s=st.sampled_from([1.0, 5.0, 120.0]),
    scale_down_after_s=st.sampled_from([0.0, 3.0, 10.0]),
    max_worker_share=st.sampled_from([0.3, 0.5, 1.0]),
)


def pair(cfg: ActivationConfig, *, planned: bool, max_staleness: int) -> list:
    """The new controller and the reference, built alike."""
    plan = catalog() if planned else None
    batch = 16 if planned else 128
    return [cls(cfg, batch_rollouts=batch, max_staleness=max_staleness, learner_price_per_hour=10.0, now=0.0,
                catalog=plan) for cls in (ActivationController, reference.ActivationController)]


def event(rng: random.Random, ids: list[str], now: float) -> tuple:
    """One random observation or membership change (applied to both controllers)."""
    worker_id = rng.choice(ids)
    kind = rng.choices(["join", "offer", "busy", "vanish", "release", "forget", "outcome", "audit", "latency",
                        "step", "swap", "segment", "tokens", "uninformative"],
                       weights=[6, 2, 12, 1, 1, 0.3, 3, 1, 2, 2, 1, 0.5, 1, 0.5])[0]
    if kind in ("join", "offer"):
        return kind, worker_id, rng.choice([0.0, 0.5, 1.0, 2.0, 5.0]), rng.choice(CLASSES)
    if kind == "busy":
        return kind, worker_id, rng.randrange(0, 400), now * rng.uniform(0.2, 1.0), rng.choice([0.0, now * 0.1])
    if kind == "outcome":
        return kind, worker_id, rng.random() < 0.8
    if kind == "audit":
        return kind, worker_id, rng.randrange(0, 20), rng.randrange(0, 3)
    if kind == "latency":
        return kind, worker_id, rng.uniform(0, 20), rng.choice([None, rng.uniform(1, 30)])
    if kind == "tokens":
        return kind, worker_id, rng.randrange(0, 1000), rng.uniform(0, 5)
    if kind == "uninformative":
        return kind, rng.randrange(0, 10), 10
    return kind, worker_id, rng.uniform(0.5, 20)


def apply(ctl, ev: tuple) -> None:
    kind, *args = ev
    method = {"busy": "observe_busy", "outcome": "observe_outcome", "latency": "observe_latencies",
              "step": "observe_step_time", "swap": "observe_swap", "segment": "observe_segment",
              "tokens": "observe_tokens", "uninformative": "observe_uninformative"}.get(kind, kind)
    if kind == "audit":
        ctl.observe_audit(args[0], audited=args[1] + args[2], failed=args[2])
    elif kind in ("step", "swap", "segment"):
        getattr(ctl, method)(args[1])
    elif kind in ("vanish", "release", "forget"):
        getattr(ctl, method)(args[0])
    else:
        getattr(ctl, method)(*args)


def state(ctl) -> dict:
    """Everything the controller keeps, Ewmas as (value, samples) (nan as a string: nan != nan)."""
    def plain(value):
        if hasattr(value, "alpha"):
            return plain(value.value), value.samples
        return "nan" if isinstance(value, float) and math.isnan(value) else value
    views = {w: {k: plain(v) for k, v in vars(view).items()} for w, view in ctl.workers.items()}
    return {"views": views, "order": list(ctl.workers), "cost": ctl.learner_cost, "last_change": ctl.last_change,
            "tick": ctl.last_tick, "snapshot": repr(ctl.snapshot()), "s_min": ctl.s_min()}


def decision_of(decision) -> tuple:
    return (decision.active, decision.required_rps, decision.reason, decision.changed,
            {k: plain_float(v) for k, v in decision.estimates.items()})


def plain_float(value: float) -> float | str:
    return "nan" if math.isnan(value) else value


@settings(max_examples=60, deadline=None)
@given(cfg=activation_configs, planned=st.sampled_from([False, False, True]), seed=st.integers(0, 2**32),
       size=st.one_of(st.integers(1, 12), st.integers(13, 300)), max_staleness=st.sampled_from([0, 2, 3]))
def test_decisions_and_bills_are_what_the_controller_before_made(cfg, planned, seed, size, max_staleness):
    rng = random.Random(seed)
    ids = [f"w{i}" for i in range(size)]
    controllers = pair(cfg, planned=planned, max_staleness=max_staleness)
    now = 0.0
    for worker_id in ids[: rng.randint(0, size)]:  # registered before the first decision
        price, cls = rng.choice([0.0, 1.0, 2.0]), rng.choice(CLASSES)
        for ctl in controllers:
            ctl.join(worker_id, price, cls)
    for _ in range(6):
        for _ in range(rng.randrange(0, 3 * size)):
            ev = event(rng, ids, now + 1.0)
            for ctl in controllers:
                apply(ctl, ev)
        now += rng.choice([0.5, 2.0, 10.0])
        if rng.random() < 0.3:
            for ctl in controllers:
                ctl.account(now - 0.25)
        new, old = (decision_of(ctl.decide(now)) for ctl in controllers)
        assert new == old
        assert state(controllers[0]) == state(controllers[1])


class CountingDict(dict):
    passes = 0

    def items(self):
        CountingDict.passes += 1
        return super().items()

    def values(self):
        CountingDict.passes += 1
        return super().values()

    def __iter__(self):
        CountingDict.passes += 1
        return super().__iter__()


def test_a_decision_takes_three_passes_over_the_workers_whatever_their_number():
    """account, the census and the new flags: the reference took seven, two of them sorts."""
    counts = []
    for size in (100, 2000):
        ctl = ActivationController(ActivationConfig(), batch_rollouts=128, max_staleness=2,
                                   learner_price_per_hour=10.0, now=0.0)
        for i in range(size):
            ctl.join(f"w{i}", 1.0 + i % 3)
        ctl.observe_step_time(1.0)
        for beat in range(1, 4):
            for i in range(5):
                ctl.observe_busy(f"w{i}", rollouts_total=40 * beat, busy_s_total=float(beat))
        ctl.workers = CountingDict(ctl.workers)
        CountingDict.passes = 0
        decision = ctl.decide(now=5.0)
        assert "on probation until measured" in decision.reason
        counts.append(CountingDict.passes)
    assert counts == [3, 3]
