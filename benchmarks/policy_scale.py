"""How the pure policy functions the coordinator calls scale to 10,000 workers, before and after
the change that made them O(N log N) or better: the broadcast plan (once per published version,
about once a second), a worker's place in it (once per worker per version), a late joiner's
sources, and the activation decision (every 2 s and when a worker is lost). The "before"
versions are the references the tests check the new ones against (tests/unit/topology_reference.py,
tests/unit/controller_reference.py), timed side by side in one run on the same inputs; each row
also says whether both returned the same thing. Single-threaded, as the coordinator's event loop
is (--pin keeps it on one core; on a shared machine that core may be the busy one); prints
JSON, and writes it with --out.

    PYTHONPATH=src python benchmarks/policy_scale.py [--quick] [--out benchmarks/results/policy_scale.json]

Timings are the best of a few runs (the machine is shared: compare within one run), with the
garbage collector on, as in the coordinator; for the plan also the median and the best with it
off (a 10,000-worker plan allocates ~100,000 objects, which can set off a full collection).
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import random
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
MEASURES = ("src/echo2/broadcast/topology.py", "src/echo2/policy", "src/echo2/protocol/broadcast.py",
            "src/echo2/config", "tests/unit/controller_reference.py", "tests/unit/topology_reference.py",
            "benchmarks/policy_scale.py")
"""The code its results measure (benchmarks/check.py lists a result as stale when it changed)."""
sys.path[:0] = [str(ROOT / "src"), str(ROOT)]

from load.provenance import provenance  # noqa: E402
from tests.unit import controller_reference, topology_reference  # noqa: E402

from echo2.broadcast.topology import fastest_first, late_joiner_assignment, plan_broadcast  # noqa: E402
from echo2.config.activation import ActivationConfig  # noqa: E402
from echo2.config.broadcast import BroadcastConfig  # noqa: E402
from echo2.policy.controller import ActivationController  # noqa: E402
from echo2.policy.dataplane import DataPlane  # noqa: E402
from echo2.protocol.broadcast import Assignment, OriginInfo, PeerInfo  # noqa: E402

MBIT = 125_000.0
SIZES = (100, 1_000, 10_000)
ORIGIN = OriginInfo(url="http://learner:1", upload_bytes_per_s=1000 * MBIT)
SHAPES = {"default": BroadcastConfig(), "chains (max_fanout=1)": BroadcastConfig(max_fanout=1)}


def times_ms(fn, repeats: int) -> list[float]:
    gc.collect()  # garbage left by what ran before is not this call's to collect
    times = []
    for _ in range(repeats):
        started = time.perf_counter()
        fn()
        times.append(round((time.perf_counter() - started) * 1000, 3))
    return sorted(times)


def best_ms(fn, repeats: int) -> float:
    return times_ms(fn, repeats)[0]


def peers(n: int, seed: int = 0) -> list[PeerInfo]:
    """Mixed links (20 Mbit/s to 1 Gbit/s up, 50 Mbit/s to 1 Gbit/s down), 30% behind NAT."""
    rng = random.Random(seed)
    out = []
    for i in range(n):
        reachable = rng.random() > 0.3
        out.append(PeerInfo(peer_id=f"w{i}", url=f"http://w{i}:1" if reachable else "", reachable=reachable,
                            upload_bytes_per_s=rng.choice([20, 50, 100, 200, 500, 1000]) * MBIT,
                            download_bytes_per_s=rng.choice([50, 100, 200, 500, 1000]) * MBIT))
    return out


def topology_rows(n: int, repeats_old: int) -> list[dict]:
    fleet = peers(n)
    rows = []
    for shape, config in SHAPES.items():
        new = plan_broadcast(1, ORIGIN, fleet, config)
        old = topology_reference.plan_broadcast(1, ORIGIN, fleet, config)
        after = times_ms(lambda config=config: plan_broadcast(1, ORIGIN, fleet, config), 7)
        gc.disable()
        gc_off = best_ms(lambda config=config: plan_broadcast(1, ORIGIN, fleet, config), 5)
        gc.enable()
        rows.append({"function": "plan_broadcast", "shape": shape, "workers": n, "same_result": new == old,
                     "before_ms": best_ms(
                         lambda config=config: topology_reference.plan_broadcast(1, ORIGIN, fleet, config),
                         repeats_old),
                     "after_ms": after[0], "after_median_ms": after[len(after) // 2], "after_gc_off_ms": gc_off,
                     "max_depth": max(a.depth for a in new.assignments)})
    plan = plan_broadcast(1, ORIGIN, fleet, BroadcastConfig())
    ids = [p.peer_id for p in fleet]

    def every_worker_after() -> list[Assignment]:
        fresh = plan.model_copy(update={"assignments": list(plan.assignments)})  # no index yet: it is timed
        return [fresh.for_worker(w) for w in ids]

    rows.append({"function": "BroadcastPlan.for_worker, every worker once", "workers": n,
                 "same_result": all(plan.for_worker(w) is topology_reference.for_worker(plan, w) for w in ids[:500]),
                 "before_ms": best_ms(lambda: [topology_reference.for_worker(plan, w) for w in ids], repeats_old),
                 "after_ms": best_ms(every_worker_after, 5)})
    values = [dict(a) for a in plan.assignments]
    rows.append({"function": "pydantic Assignment objects of the plan", "workers": n,
                 "validated_ms": best_ms(lambda: [Assignment(**v) for v in values], 5),
                 "model_construct_ms": best_ms(lambda: [Assignment.model_construct(**v) for v in values], 5),
                 "note": "what building the assignments alone costs (both ways); the plan keeps them validated"})
    joiner = PeerInfo(peer_id="late", url="http://late:1", upload_bytes_per_s=MBIT, download_bytes_per_s=100 * MBIT)
    args = (1, joiner, fleet)
    ordered = fastest_first(fleet)
    kwargs = {"origin": ORIGIN, "config": BroadcastConfig()}
    rows.append({"function": "late_joiner_assignment, all workers hold it", "workers": n,
                 "same_result": late_joiner_assignment(*args, **kwargs)
                 == topology_reference.late_joiner_assignment(*args, **kwargs),
                 "before_ms": best_ms(lambda: topology_reference.late_joiner_assignment(*args, **kwargs), 5),
                 "after_ms": best_ms(lambda: late_joiner_assignment(*args, **kwargs), 5),
                 "after_holders_ordered_ms": best_ms(lambda: late_joiner_assignment(
                     1, joiner, ordered, **kwargs, holders_ordered=True), 5),
                 "ordering_once_per_version_ms": best_ms(lambda: fastest_first(fleet), 5)})
    return rows


def fleet_controller(cls, n: int, *, measured: int = 8):
    """n registered workers, `measured` of them measured at 40 rollouts/s (they cover the
    demand of 128 rollouts/s), the rest unmeasured: on probation or idle."""
    ctl = cls(ActivationConfig(), batch_rollouts=128, max_staleness=2, learner_price_per_hour=10.0, now=0.0)
    rng = random.Random(n)
    for i in range(n):
        ctl.join(f"w{i}", rng.choice([0.5, 1.0, 2.0, 4.0]))
    for beat in range(1, 5):
        ctl.observe_step_time(1.0)
        for i in range(measured):
            ctl.observe_busy(f"w{i}", rollouts_total=40 * beat, busy_s_total=float(beat))
    return ctl


def decisions(ctl) -> list[tuple]:
    """The first decision (everyone registered active), two steady ones, one after a loss."""
    out = []
    for now in (1.0, 3.0, 5.0):
        d = ctl.decide(now)
        out.append((d.active, d.reason, d.changed))
    ctl.vanish(sorted(ctl.workers)[0])
    d = ctl.decide(7.0)
    return out + [(d.active, d.reason, d.changed)]


def timed_decision(cls, n: int, scenario: str) -> float:
    """Seconds of one decide: the first one, a steady one, or one after a measured worker is lost."""
    ctl = fleet_controller(cls, n)
    if scenario != "first":
        ctl.decide(1.0)
    if scenario == "lost":
        ctl.vanish("w0")
    started = time.perf_counter()
    ctl.decide(3.0)
    return time.perf_counter() - started


def controller_rows(n: int) -> list[dict]:
    versions = {"before_ms": controller_reference.ActivationController, "after_ms": ActivationController}
    same = decisions(fleet_controller(ActivationController, n)) == decisions(
        fleet_controller(controller_reference.ActivationController, n))
    rows = []
    for scenario, label in (("first", "first decision (every worker registered active)"),
                            ("steady", "steady decision"), ("lost", "decision after a measured worker is lost")):
        timing = {key: round(min(timed_decision(cls, n, scenario) for _ in range(3)) * 1000, 3)
                  for key, cls in versions.items()}
        rows.append({"function": f"ActivationController.decide, {label}", "workers": n, "same_result": same,
                     **timing})
    timing = {}
    for key, cls in versions.items():
        ctl = fleet_controller(cls, n)
        ctl.decide(1.0)
        timing[key] = best_ms(lambda ctl=ctl: ctl.account(ctl.last_tick + 1.0), 5)
    rows.append({"function": "ActivationController.account, steady", "workers": n, **timing})
    return rows


def dataplane_rows(n: int) -> list[dict]:
    """Per-request calls the coordinator makes, at n workers with standing: O(1) in n."""
    plane = DataPlane(max_staleness=2, groups_per_step=64, version_of=lambda g: g, segment_swaps=True)
    plane.publish(5)
    plane.step_time_s = 1.0
    for i in range(n):
        plane.trust.submitted(f"w{i}", 1.0, accepted=i % 2 == 0)
    for i in range(64):
        plane.observe_generation(5.0 + i % 7, 0.5)
    calls = 10_000
    grant = best_ms(lambda: [plane.grant(5, 4, leased=100, held_by_worker=1, worker_id=f"w{i % n}", held_by_new=3)
                             for i in range(calls)], 3)
    may = best_ms(lambda: [plane.may_lease(4) for _ in range(calls)], 3)
    admits = best_ms(lambda: [plane.admits(4) for _ in range(calls)], 3)
    return [{"function": "DataPlane per request (us per call)", "workers": n,
             "grant_us": round(grant * 1000 / calls, 2), "may_lease_us": round(may * 1000 / calls, 2),
             "admits_us": round(admits * 1000 / calls, 2)}]


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="100 and 1,000 workers only")
    parser.add_argument("--out", help="also write the JSON here")
    parser.add_argument("--pin", action="store_true", help="run on the first core only")
    args = parser.parse_args(argv)
    if args.pin:
        os.sched_setaffinity(0, {min(os.sched_getaffinity(0))})
    out: dict = {"benchmark": "policy_scale", "provenance": provenance(ROOT, argv), "rows": []}
    for n in SIZES[:2] if args.quick else SIZES:
        repeats_old = 1 if n >= 10_000 else 3
        out["rows"] += topology_rows(n, repeats_old) + controller_rows(n) + dataplane_rows(n)
    out["provenance"]["load_average_1_5_15_after"] = [round(x, 2) for x in os.getloadavg()]
    text = json.dumps(out, indent=2)
    print(text)
    if args.out:
        Path(args.out).write_text(text + "\n")
    return 0 if all(row.get("same_result", True) for row in out["rows"]) else 1


if __name__ == "__main__":
    sys.exit(main())
