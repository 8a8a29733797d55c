"""The simulator: wires the learner, the data plane, the fleet, the broadcast and the activation
controller onto one event loop, runs a scenario for its number of learner steps and collects
the result. Deterministic: the same scenario and seed give the same result, event for event.
"""

from __future__ import annotations

import random
import time
from collections.abc import Callable

from echo2.config.sim import ScenarioConfig
from echo2.planner.cost import SECONDS_PER_HOUR
from echo2.sim import result as res
from echo2.sim.broadcast import Network
from echo2.sim.control import Controller, initial_counts
from echo2.sim.dataplane import SimDataPlane
from echo2.sim.events import EventLoop
from echo2.sim.fleet import Fleet, build_workers
from echo2.sim.learner import Learner
from echo2.sim.rounds import Broadcaster


class Simulator:
    def __init__(self, scenario: ScenarioConfig, fleet_counts: dict[str, int] | None = None) -> None:
        """`fleet_counts` rents exactly those workers per class for the whole run (mode
        "fixed"); otherwise the scenario's `sim.activation` decides."""
        self.scenario = scenario
        self.fleet_counts = fleet_counts

    def run(self) -> res.SimResult:
        started = time.perf_counter()
        scenario, work, sim = self.scenario, self.scenario.workload, self.scenario.sim
        loop = EventLoop()

        # the data plane: the policy core the coordinator drives, over counts
        data = self._data_plane(clock=lambda: loop.now_s)

        # the fleet and the broadcast that feeds it
        fleet = Fleet(scenario, build_workers(scenario), loop, data)
        broadcaster = Broadcaster(self._network(), loop, fleet, pull=sim.announce_interval_s > 0,
                                  catch_up_bytes=self.scenario.workload.catch_up_bytes)
        fleet.on_join = broadcaster.kick

        # who is rented: a plan, everyone, or the counts given
        mode = "fixed" if self.fleet_counts is not None else sim.activation
        counts, plan = (self.fleet_counts, {}) if self.fleet_counts is not None else initial_counts(scenario)
        controller = Controller(scenario, fleet, loop, mode)
        controller.rent_initial(counts)

        # the learner consumes batches and publishes each new version into the broadcast
        learner = Learner(
            loop,
            data,
            steps=sim.steps,
            step_time_s=work.step_time_s,
            step_time_cv=sim.step_time_cv,
            rng=random.Random(sim.seed),
            publish=broadcaster.publish,
            profile=sim.workload_profile,
        )
        fleet.on_submit = learner.try_take
        learner.on_step = controller.observe_step_time

        # machines come up at their start delay; the learner publishes version 0 and asks
        for w in fleet.workers:
            delay_s = scenario.workers[w.cls].start_delay_s
            loop.at(delay_s, fleet.join, w, delay_s)
        learner.start()

        # nobody rented (the planner found no admissible fleet): nothing can ever feed the
        # learner, and unrented machines coming and going would only spin until max_sim_s
        finished = loop.run(horizon_s=sim.max_sim_s) if any(counts.values()) or mode == "online" else False

        fleet.close_billing()
        return self._collect(
            learner,
            data,
            fleet,
            broadcaster=broadcaster,
            controller=controller,
            counts=counts,
            plan=plan,
            finished=finished,
            events=loop.processed,
            run_s=time.perf_counter() - started,
        )

    def _data_plane(self, *, clock: Callable[[], float]) -> SimDataPlane:
        work, sim = self.scenario.workload, self.scenario.sim
        return SimDataPlane(work.max_staleness, work.prompts_per_step, fresh_leases=sim.fresh_leases, clock=clock,
                            slow_start=sim.slow_start, uninformative_share=work.uninformative_share,
                            rng=random.Random(f"{sim.seed}:uninformative"),  # its own stream: d = 0 changes no draw
                            max_masked_fraction=work.max_masked_fraction, segment_s=work.segment_s,
                            audit_share=sim.audit_share, audit_rng=random.Random(f"{sim.seed}:audit"))

    def _network(self) -> Network:
        net, s = self.scenario.broadcast, self.scenario
        return Network(
            net.topology,
            s.workload.snapshot_bytes,
            s.learner.uplink_bps,
            net.chunk_bytes,
            net.fanout,
            net.hop_latency_s,
        )

    def _collect(self, learner: Learner, data: SimDataPlane, fleet: Fleet, *, broadcaster: Broadcaster,
                 controller: Controller, counts: dict[str, int], plan: dict, finished: bool, events: int,
                 run_s: float) -> res.SimResult:
        scenario = self.scenario
        steps_done = len(learner.busy_s) if finished else learner.step
        wall_s = learner.end_s if finished else learner.loop.now_s
        if learner.waiting_since_s is not None:  # cut off while starved: that wait counts too
            learner.wait_s.append(learner.loop.now_s - learner.waiting_since_s)
            learner.busy_s.append(0.0)
        learner_cost = scenario.learner.price_per_hour * wall_s / SECONDS_PER_HOUR
        c = data.counters
        bill = res.fleet_bill(fleet.workers, steps_done, c.trained)
        total = learner_cost + bill["fleet_cost"]
        baseline = res.centralized_baseline(scenario, steps_done)
        return res.SimResult(
            scenario=scenario.name,
            model=scenario.workload.model,
            steps_requested=scenario.sim.steps,
            steps_done=steps_done,
            finished=finished,
            wall_s=wall_s,
            utilization=learner.utilization(),
            utilization_steady=learner.utilization(skip_first=True),
            first_wait_s=learner.wait_s[0] if learner.wait_s else 0.0,
            uninformative_share=scenario.workload.uninformative_share,
            rollouts_generated=fleet.rollouts,
            rollouts_per_s=fleet.rollouts / wall_s if wall_s > 0 else 0.0,
            trained_rollouts_per_s=c.trained * scenario.workload.group_size / wall_s if wall_s > 0 else 0.0,
            groups={"leased": c.leased, "accepted": c.accepted, "trained": c.trained,
                    "dropped_stale": c.dropped_stale, "dropped_on_arrival": c.dropped_on_arrival,
                    "requeued": c.requeued, "dropped_uninformative": c.dropped_uninformative},
            staleness_hist={str(k): v for k, v in sorted(c.staleness_hist.items())},
            segment_s=scenario.workload.segment_s,
            tokens=res.token_staleness(c.token_staleness_hist, c.tokens_masked_stale),
            rounds=len(broadcaster.rounds),
            round_latency_s=res.percentiles([r.last_s for r in broadcaster.rounds]),
            publish_to_loaded_s=res.percentiles(fleet.loaded_latency_s),
            fleet=dict(counts),
            worker_hours=res.worker_hours(
                [w.cls for w in fleet.workers], [w.billed_s for w in fleet.workers]
            ),
            preemptions=sum(w.preemptions for w in fleet.workers),
            controller_switches=controller.switches,
            fleet_time_h=res.fleet_time_h(fleet.workers, wall_s),
            releases=controller.provider.releases,
            acquires=controller.provider.acquires,
            learner_cost=learner_cost,
            **bill,
            total_cost=total,
            cost_per_step=total / steps_done if steps_done else float("inf"),
            baseline=baseline,
            saving_fraction=res.saving(total, baseline),
            plan=plan,
            per_worker=[_worker_row(w) for w in fleet.workers],
            events=events,
            run_s=run_s,
        )


def _worker_row(w) -> dict:
    """One simulated worker's totals, as the result's `per_worker` rows."""
    return {
        "index": w.index, "class": w.cls, "rollouts": w.rollouts, "billed_s": w.billed_s, "active_s": w.active_s,
        "idle_s": w.idle_s, "preemptions": w.preemptions, "versions_loaded": w.loads,
        "publish_to_loaded_s": w.loaded_latency_s / w.loads if w.loads else None,
    }


def simulate(scenario: ScenarioConfig, fleet_counts: dict[str, int] | None = None) -> res.SimResult:
    """Run one scenario (see `Simulator`)."""
    return Simulator(scenario, fleet_counts).run()
