"""`GET /metrics`: the run in Prometheus' text format (prometheus-client), read from the same
view as the dashboard (`view.run_view`) at scrape time by a custom collector, so no gauge is
updated anywhere else. Each app has its own `CollectorRegistry` (tests start several
coordinators in one process; the global registry would mix them).

Names follow Prometheus' conventions (`_seconds`, `_bytes`, `_total` on counters); per-worker
series carry a `worker` label and stay bounded by `view.MAX_WORKER_ROWS`."""

from __future__ import annotations

from collections.abc import Iterator
from typing import TYPE_CHECKING

from aiohttp import web
from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, HistogramMetricFamily, Metric
from prometheus_client.exposition import CONTENT_TYPE_LATEST
from prometheus_client.registry import Collector

from echo2.coordinator.http.history import RunHistory
from echo2.coordinator.http.view import run_view

if TYPE_CHECKING:
    from echo2.coordinator.state import CoordinatorState

REGISTRY_KEY = web.AppKey("prometheus_registry", CollectorRegistry)


class RunCollector(Collector):
    def __init__(self, state: CoordinatorState, history: RunHistory) -> None:
        self.state, self.history = state, history

    def collect(self) -> Iterator[Metric]:
        view = run_view(self.state, self.history)
        yield from _run_metrics(view)
        yield _staleness(view["staleness_hist"])
        yield _staleness(view["token_staleness_hist"], "echo2_token_staleness_steps", "Staleness of the tokens the "
                         "learner trained (step - the version that sampled each token)")
        yield CounterMetricFamily("echo2_tokens_masked_stale", "Tokens masked out of the loss as older than S",
                                  value=view["tokens_masked_stale"])
        yield from _worker_metrics(view["workers"])


def _gauge(name: str, doc: str, value: float | None) -> Iterator[Metric]:
    if value is not None:  # unknown yet (no step trained, no eval): no sample rather than a made-up 0
        yield GaugeMetricFamily(name, doc, value=value)


def _run_metrics(view: dict) -> Iterator[Metric]:
    yield from _gauge("echo2_learner_step", "Learner step the coordinator hands batches for", view["learner_step"])
    yield from _gauge("echo2_policy_version", "Newest published policy version", view["version"])
    yield from _gauge("echo2_learner_utilization_ratio", "Share of the learner's recent step-loop time not spent "
                      "waiting for data (last 20 steps)", view["learner_utilization"])
    reward, accuracy = view["curves"]["reward"], view["curves"]["accuracy"]
    yield from _gauge("echo2_reward_mean", "Mean reward of the last trained batch", reward[-1][1] if reward else None)
    yield from _gauge("echo2_heldout_accuracy_ratio", "Held-out accuracy at the last evaluation",
                      accuracy[-1][1] if accuracy else None)
    yield from _gauge("echo2_prompts_queued", "Prompts waiting to be leased (returned ones)", view["queued"])
    yield from _gauge("echo2_leases_outstanding", "Prompts leased to workers and not yet submitted", view["leased"])
    yield from _gauge("echo2_groups_buffered", "Admitted rollout groups waiting for a batch", view["buffered"])
    yield from _gauge("echo2_workers_live", "Registered workers not timed out or gone", view["workers_live"])
    yield from _gauge("echo2_workers_active", "Workers the activation controller runs", view["workers_active"])
    yield from _gauge("echo2_required_rollouts_per_second", "Rollouts/s the learner consumes", view["required_rps"])
    yield from _gauge("echo2_cost_dollars_per_hour", "What the run bills now: the learner and every rented worker",
                      view["cost"]["per_hour"])
    yield CounterMetricFamily("echo2_cost_dollars", "Billed since the run started", value=view["cost"]["total"])
    bill = view["fleet_bill"]
    if bill:
        yield CounterMetricFamily("echo2_fleet_billed_dollars", "What the machines a remote provider rented have "
                                  "billed, from acquire to release, boot included (its ledger)",
                                  value=bill["billed_usd"])
        yield from _gauge("echo2_fleet_machines_held", "Machines the provider holds now", len(bill["held_at_end"]))
    yield from _gauge("echo2_uninformative_share_ratio", "Share of scored groups dropped as uninformative (every "
                      "reward equal: never trained, their prompts refilled)", view["uninformative_share"])
    counters = dict(view["counters"])
    yield CounterMetricFamily("echo2_completions_truncated", "Completions cut off at sampling.max_new_tokens without "
                              "an end of sequence", value=counters.pop("completions_truncated"))
    groups = CounterMetricFamily("echo2_groups", "Rollout groups by outcome (coordinator counters)",
                                 labels=["outcome"])
    for outcome, count in counters.items():
        groups.add_metric([outcome], count)
    yield groups


def _staleness(hist: dict[str, int], name: str = "echo2_staleness_steps",
               doc: str = "Staleness of the rollout groups the learner was given (step - version)") -> Metric:
    """Groups (or tokens) per staleness (learner step - version they were generated with) over
    the assigned batches, as a histogram with a bucket per step of staleness."""
    counts = {int(k): v for k, v in hist.items()}
    buckets, running = [], 0
    for staleness in range(min(counts, default=0), max(counts, default=0) + 1):
        running += counts.get(staleness, 0)
        buckets.append((str(float(staleness)), running))
    buckets.append(("+Inf", running))
    return HistogramMetricFamily(name, doc, buckets=buckets, sum_value=sum(k * v for k, v in counts.items()))


def _worker_metrics(rows: list[dict]) -> Iterator[Metric]:
    families = {
        "version": GaugeMetricFamily("echo2_worker_version", "Policy version the worker's engine holds",
                                     labels=["worker"]),
        "active": GaugeMetricFamily("echo2_worker_active", "1 while the controller runs the worker", labels=["worker"]),
        "tokens_per_s": GaugeMetricFamily("echo2_worker_tokens_per_second", "Generated tokens per second of "
                                          "generation", labels=["worker"]),
        "publish_to_loaded_s": GaugeMetricFamily("echo2_worker_publish_to_loaded_seconds", "Last version: publish "
                                                 "until the worker generates with it (its heartbeats' figure)",
                                                 labels=["worker"]),
        "bytes_relayed": CounterMetricFamily("echo2_worker_relayed_bytes", "Weight bytes the worker's relay sent "
                                             "to peers (its heartbeats' figure)", labels=["worker"]),
        "price_per_hour": GaugeMetricFamily("echo2_worker_price_dollars_per_hour", "The worker's price",
                                            labels=["worker"]),
    }
    for row in rows:
        values = {**row, "active": 1.0 if row["status"] == "active" else 0.0}
        for key, family in families.items():
            if values[key] is not None:
                family.add_metric([row["worker_id"]], values[key])
    yield from families.values()


def add_metrics_route(app: web.Application, state: CoordinatorState, history: RunHistory) -> None:
    registry = CollectorRegistry(auto_describe=False)
    registry.register(RunCollector(state, history))
    app[REGISTRY_KEY] = registry
    app.router.add_get("/metrics", handle_metrics)


async def handle_metrics(request: web.Request) -> web.Response:
    return web.Response(body=generate_latest(request.app[REGISTRY_KEY]), headers={"Content-Type": CONTENT_TYPE_LATEST})
