"""The SkyPilot fleet (echo2.launch.skypilot) driven through a recording stand-in for SkyPilot
(`RecordingSky`, declaring `SkyApi`) with scripted boot delays, preemptions and failures:
launch -> registration -> release -> down, a preempted spot worker replaced by one of the same
class, a failed launch falling back to the next class, a failed down kept held and tried again,
and close downing all the ledger holds. The ledger and its billing are asserted on each path.

`SkySdk`, the real implementation, is checked against the installed SkyPilot's signatures (each
SDK function the stand-in replaces binds the call as the real one would) and for its timeouts."""

from __future__ import annotations

import inspect
import json
import threading
import time
from pathlib import Path
from typing import Any

import pytest
from tests.unit.seams import mismatches

from echo2.config.catalog import WorkerClass
from echo2.launch.fleet import FleetSync
from echo2.launch.sky_api import ClusterGone, SkyApi, SkySdk, SkyTimeouts
from echo2.launch.skypilot import SkyPilotFleet, WorkerLaunch, cluster_name
from echo2.report.fleet_ledger import FleetLedger
from echo2.report.metrics import MetricsWriter, read_metrics

sky = pytest.importorskip("sky", reason="SkyPilot is not installed here: `make test-skypilot` runs these in "
                                        ".venv-skypilot")

RUN = "run-1"
TOKEN = "join-token-9f2c"
BOOT_S = 0.15


def _cls(price: float, accelerator: str) -> WorkerClass:
    return WorkerClass.model_validate({"price_per_hour": price, "count": 4, "tokens_per_s": 600, "bandwidth_bps": 1e9,
                                       "skypilot": {"use_spot": True, "accelerators": [accelerator]}})


CATALOG = {"l4_spot": _cls(0.36, "L4:1"), "a10g_spot": _cls(0.50, "A10G:1"), "h100_spot": _cls(2.90, "H100:1")}


class RecordingSky(SkyApi):
    """SkyPilot as a script: launches take `boot_s` in `get`, classes in `failing` find no
    capacity, `preempt` takes a cluster back, `failing_downs` downs fail before one succeeds."""

    def __init__(self, ledger: FleetLedger, *, boot_s: float = BOOT_S, failing: set[str] = frozenset(),
                 failing_downs: int = 0) -> None:
        self.ledger, self.boot_s, self.failing, self.failing_downs = ledger, boot_s, set(failing), failing_downs
        self.clusters: dict[str, str] = {}  # cluster -> status
        self.requests: dict[str, tuple] = {}
        self.calls: list[tuple] = []
        self.held_at_launch: list[set[str]] = []
        self.lock = threading.Lock()

    def launch(self, task: sky.Task, cluster_name: str) -> str:
        worker_class = task.envs["ECHO2_WORKER_CLASS"]
        assert task.secrets["ECHO2_AUTH_TOKEN"].get_secret_value() == TOKEN
        with self.lock:
            self.held_at_launch.append({h.machine for h in self.ledger.held().values()})
            return self._request("launch", cluster_name, worker_class)

    def down(self, cluster_name: str) -> str:
        with self.lock:
            return self._request("down", cluster_name)

    def status(self, cluster_names: list[str]) -> str:
        with self.lock:
            return self._request("status", tuple(cluster_names))

    def get(self, request_id: str, timeout_s: float) -> Any:
        kind, target, *rest = self.requests[request_id]
        if kind == "launch":
            time.sleep(self.boot_s)
            if rest[0] in self.failing:
                raise RuntimeError(f"ResourcesUnavailableError: no {rest[0]} capacity in any region")
            with self.lock:
                self.clusters[target] = "UP"
            return (1, None)
        with self.lock:
            if kind == "status":
                return [{"name": name, "status": self.clusters[name]} for name in target if name in self.clusters]
            if self.failing_downs:
                self.failing_downs -= 1
                raise TimeoutError("SkyPilot request: no answer within 600 s")
            if target not in self.clusters:
                raise ClusterGone(f"cluster {target!r} does not exist")
            del self.clusters[target]
        return None

    def preempt(self, cluster: str) -> None:
        with self.lock:
            self.clusters[cluster] = "STOPPED"

    def kinds(self) -> list[tuple]:
        return [call for call in self.calls if call[0] != "status"]

    def _request(self, kind: str, *args: object) -> str:
        request_id = f"req-{len(self.requests)}"
        self.requests[request_id] = (kind, *args)
        self.calls.append((kind, *args))
        return request_id


@pytest.fixture
def run_dir(tmp_path: Path) -> Path:
    return tmp_path


def make_fleet(run_dir: Path, *, workers: dict[str, str], fallbacks=None, **script) -> tuple:
    ledger = FleetLedger(run_dir)
    api = RecordingSky(ledger, **script)
    metrics = MetricsWriter(run_dir / "metrics.jsonl", role="launcher")
    fleet = SkyPilotFleet(api, ledger, metrics, run_id=RUN, catalog=CATALOG, workers=workers,
                          launch=WorkerLaunch("http://10.0.0.5:8470", "echo2==0.1.0", auth_token=TOKEN),
                          fallbacks=fallbacks, timeouts=SkyTimeouts(status_every_s=1.0, retry_after_s=60.0),
                          threads=2)
    return fleet, api, ledger


def coordinator(kind: str, worker_id: str) -> dict:
    return {"role": "coordinator", "kind": kind, "worker_id": worker_id, "time": time.time()}


def ledger_events(ledger: FleetLedger) -> list[tuple]:
    lines = [json.loads(line) for line in ledger.path.read_text().splitlines()]
    return [(r["event"], r["worker_id"], r.get("worker_class") or r.get("reason")) for r in lines]


def metric_kinds(run_dir: Path) -> list[str]:
    return [r["kind"] for r in read_metrics(run_dir / "metrics.jsonl")]


def test_the_sky_stand_in_and_the_sdk_match_the_seam():
    assert mismatches(SkyApi, RecordingSky) == []
    assert mismatches(SkyApi, SkySdk) == []


def test_launch_register_release_down_and_the_bill(run_dir):
    fleet, api, ledger = make_fleet(run_dir, workers={"w0": "l4_spot", "w1": "l4_spot"})
    assert fleet.released() == {"w0", "w1"}  # nothing rented until the controller chooses it
    started = time.monotonic()
    fleet.acquire("w0")
    assert time.monotonic() - started < BOOT_S / 2  # the launcher's loop is not held up by the boot
    assert "w0" in fleet.booting() and fleet.released() == {"w1"}
    assert fleet.settle(5)
    name = cluster_name(RUN, "w0")
    assert api.held_at_launch == [{name}]  # the ledger had it before SkyPilot was asked
    assert api.clusters == {name: "UP"} and ledger.held()["w0"].details["cluster"] == name
    fleet.observe(coordinator("worker_registered", "w0"))
    assert fleet.booting() == {}
    fleet.release("w0")
    assert fleet.released() == {"w0", "w1"}
    assert fleet.settle(5)
    assert api.kinds() == [("launch", name, "l4_spot"), ("down", name)] and api.clusters == {}
    assert ledger_events(ledger) == [("acquiring", "w0", "l4_spot"), ("started", "w0", None),
                                     ("released", "w0", "idle")]
    held = ledger.holdings()["w0"]
    assert ledger.held() == {} and held.billed_s(time.time()) >= BOOT_S
    assert ledger.billed_usd() == pytest.approx(held.billed_s(0) * 0.36 / 3600)
    rejoined = [r for r in read_metrics(run_dir / "metrics.jsonl") if r["kind"] == "worker_rejoined"]
    assert rejoined[0]["rejoin_s"] >= BOOT_S
    assert metric_kinds(run_dir) == ["worker_acquired", "worker_rejoined", "worker_released"]
    fleet.close()


def test_a_preempted_worker_is_replaced_by_one_of_its_class(run_dir):
    fleet, api, ledger = make_fleet(run_dir, workers={"w0": "a10g_spot"})
    fleet.acquire("w0")
    assert fleet.settle(5)
    fleet.observe(coordinator("worker_registered", "w0"))
    name = cluster_name(RUN, "w0")
    api.preempt(name)
    fleet.poll(now=100.0)  # the status check sees the cluster stopped ...
    assert fleet.settle(5)
    fleet.poll(now=100.5)  # ... but the worker is not lost yet: nothing replaced, no second status call
    assert fleet.settle(5) and [c[0] for c in api.calls] == ["launch", "status"]
    fleet.observe(coordinator("worker_lost", "w0"))
    fleet.poll(now=101.0)
    assert "w0" not in fleet.released()  # held while it is replaced: the controller does not re-acquire it
    assert fleet.settle(5)
    assert api.kinds() == [("launch", name, "a10g_spot"), ("down", name), ("launch", name, "a10g_spot")]
    assert api.clusters == {name: "UP"} and "w0" in fleet.booting()
    assert ledger_events(ledger) == [("acquiring", "w0", "a10g_spot"), ("started", "w0", None),
                                     ("released", "w0", "preempted"), ("acquiring", "w0", "a10g_spot"),
                                     ("started", "w0", None)]
    assert ledger.held()["w0"].worker_class == "a10g_spot"
    now = time.time()
    preempted, replacement = ledger.spans()  # each acquire bills on its own, boot included
    assert preempted.released_at is not None and replacement.released_at is None
    assert ledger.billed_usd(now) == pytest.approx((preempted.billed_s(now) + replacement.billed_s(now)) * 0.50 / 3600)
    assert ledger.holdings()["w0"].acquired_at == replacement.acquired_at
    assert "worker_preempted" in metric_kinds(run_dir) and "skypilot_cluster_gone" in metric_kinds(run_dir)
    assert fleet.close() == [] and ledger.held() == {}


def test_a_failed_launch_falls_back_to_the_next_class(run_dir):
    fleet, api, ledger = make_fleet(run_dir, workers={"w0": "a10g_spot"}, failing={"a10g_spot"},
                                    fallbacks={"a10g_spot": ["l4_spot", "h100_spot"]})
    fleet.acquire("w0")
    assert fleet.settle(5)
    name = cluster_name(RUN, "w0")
    assert api.kinds() == [("launch", name, "a10g_spot"), ("down", name), ("launch", name, "l4_spot")]
    assert ledger_events(ledger) == [("acquiring", "w0", "a10g_spot"), ("released", "w0", "launch_failed"),
                                     ("acquiring", "w0", "l4_spot"), ("started", "w0", None)]
    assert ledger.held()["w0"].price_per_hour == 0.36
    failed = [r for r in read_metrics(run_dir / "metrics.jsonl") if r["kind"] == "skypilot_launch_failed"]
    assert failed[0]["worker_class"] == "a10g_spot" and failed[0]["next_class"] == "l4_spot"
    assert "no a10g_spot capacity" in failed[0]["error"]
    spans = ledger.spans()
    assert [s.worker_class for s in spans] == ["a10g_spot", "l4_spot"] and spans[0].billed_s(0) >= BOOT_S
    fleet.close()


def test_no_class_left_releases_the_worker_and_waits_before_trying_again(run_dir):
    fleet, api, ledger = make_fleet(run_dir, workers={"w0": "h100_spot"}, failing={"h100_spot", "l4_spot"},
                                    fallbacks={"h100_spot": ["l4_spot"]}, boot_s=0.01)
    fleet.acquire("w0")
    assert fleet.settle(5)
    assert fleet.released() == {"w0"} and ledger.held() == {}
    fleet.acquire("w0")  # chosen again at once: not before retry_after_s
    assert fleet.settle(5) and [c[0] for c in api.calls].count("launch") == 2
    assert metric_kinds(run_dir)[-1] == "worker_acquire_failed"


def test_a_failed_down_stays_held_and_is_tried_again(run_dir):
    fleet, api, ledger = make_fleet(run_dir, workers={"w0": "l4_spot"}, failing_downs=1, boot_s=0.01)
    fleet.acquire("w0")
    assert fleet.settle(5)
    fleet.release("w0")
    assert fleet.settle(5)
    assert "w0" in ledger.held() and fleet.released() == set()  # may still bill: not the controller's to re-acquire
    fleet.poll(now=10.0)
    assert fleet.settle(5) and ledger.held() == {} and fleet.released() == {"w0"}
    assert ledger_events(ledger)[-1] == ("released", "w0", "idle")
    assert "skypilot_down_failed" in metric_kinds(run_dir)


def test_close_downs_everything_the_ledger_holds(run_dir):
    # a machine a previous launcher of this run left behind is in the ledger too
    FleetLedger(run_dir).acquiring("old", provider="skypilot", machine="e2-old-cluster", worker_class="l4_spot",
                                   price_per_hour=0.36)
    fleet, api, ledger = make_fleet(run_dir, workers={"w0": "l4_spot", "w1": "a10g_spot"}, boot_s=0.01)
    api.clusters["e2-old-cluster"] = "UP"
    fleet.acquire("w0")
    fleet.acquire("w1")
    assert fleet.settle(5) and len(api.clusters) == 3
    assert fleet.close("interrupted") == []
    assert api.clusters == {} and ledger.held() == {}
    assert {e for e in ledger_events(ledger) if e[0] == "released"} == {
        ("released", w, "interrupted") for w in ("old", "w0", "w1")}
    fleet.acquire("w0")  # closed: nothing more is rented
    assert [c[0] for c in api.calls].count("launch") == 2


def test_fleet_sync_drives_the_fleet_from_activation_decisions(run_dir):
    fleet, api, ledger = make_fleet(run_dir, workers={"w0": "l4_spot", "w1": "l4_spot"}, boot_s=0.01)
    sync = FleetSync(fleet, release_after_s=0.0)
    sync.observe({"role": "coordinator", "kind": "activation", "active": ["w0", "w1"], "time": time.time()}, 0.0)
    sync.step(0.0)
    assert fleet.settle(5) and len(api.clusters) == 2
    for worker in ("w0", "w1"):
        sync.observe(coordinator("worker_registered", worker), 1.0)
    sync.observe({"role": "coordinator", "kind": "activation", "active": ["w0"], "time": time.time()}, 2.0)
    sync.step(2.0)
    assert fleet.settle(5) and api.clusters == {cluster_name(RUN, "w0"): "UP"}
    assert set(ledger.held()) == {"w0"}
    fleet.close()


def _binding(real, result):
    """Stands in for an SDK function: the call must bind to the real function's signature."""
    calls = []

    def fake(*args, **kwargs):
        inspect.signature(real).bind(*args, **kwargs)
        calls.append((args, kwargs))
        return result
    return fake, calls


def test_the_sdk_calls_skypilot_as_its_signatures_say(monkeypatch):
    launch, launched = _binding(sky.launch, "req-launch")
    down, downed = _binding(sky.down, "req-down")
    status, asked = _binding(sky.status, "req-status")
    get, got = _binding(sky.get, [{"name": "c", "status": "UP"}])
    for name, fake in (("launch", launch), ("down", down), ("status", status), ("get", get)):
        monkeypatch.setattr(sky, name, fake)
    sdk = SkySdk(submit_timeout_s=5, idle_down_minutes=10)
    task = sky.Task(run="true")
    assert sdk.launch(task, "e2-c") == "req-launch" and sdk.down("e2-c") == "req-down"
    assert sdk.status(["e2-c"]) == "req-status" and sdk.get("req-status", timeout_s=5) == [{"name": "c",
                                                                                             "status": "UP"}]
    assert launched[0][1] == {"cluster_name": "e2-c", "retry_until_up": False, "idle_minutes_to_autostop": 10,
                              "down": True}
    assert asked[0][1]["refresh"] == sky.StatusRefreshMode.AUTO and got[0][0] == ("req-status",)


def test_the_sdk_gives_up_on_a_request_and_cancels_it(monkeypatch):
    cancel, cancelled = _binding(sky.api_cancel, "req-cancel")
    monkeypatch.setattr(sky, "get", lambda request_id: time.sleep(5))
    monkeypatch.setattr(sky, "api_cancel", cancel)
    started = time.monotonic()
    with pytest.raises(TimeoutError, match="SkyPilot request req-1: no answer within 0 s"):
        SkySdk(submit_timeout_s=1).get("req-1", timeout_s=0.2)
    assert time.monotonic() - started < 2 and cancelled[0][0] == ("req-1",)

    def missing(request_id):
        raise sky.exceptions.ClusterDoesNotExist("Cluster 'e2-c' does not exist.")
    monkeypatch.setattr(sky, "get", missing)
    with pytest.raises(ClusterGone):
        SkySdk().get("req-2", timeout_s=1)


def test_a_run_with_provider_skypilot_rents_the_catalog_classes_cheapest_first(run_dir):
    """`echo2 run --provider skypilot`'s fleet (launch.remote_fleet): `count` workers of each
    class with a SkyPilot table, each class falling back to the others cheapest first, every task
    through SkyPilot's parser, the ledger in the run dir."""
    from echo2.config.run import RunConfig
    from echo2.launch.remote_fleet import make_remote_fleet

    catalog = Path(__file__).resolve().parents[2] / "configs" / "catalog" / "skypilot_example.toml"
    cfg = RunConfig(run_dir=str(run_dir), activation={"provider": "skypilot", "catalog": str(catalog)})
    api = RecordingSky(FleetLedger(run_dir), failing={"g24_spot"})
    fleet = make_remote_fleet(cfg, coordinator_url="http://10.0.0.5:8470", auth_token=TOKEN, warn=print,
                              sky_api=api, echo2_spec="echo2==0.1.0")
    try:
        assert fleet.worker_ids() == {o.worker_id for o in cfg.offered_workers()}
        prices = {c: w.price_per_hour for c, w in fleet.catalog.items() if w.skypilot is not None}
        assert fleet.fallbacks["g24_spot"] == sorted(set(prices) - {"g24_spot"}, key=prices.get)
        fleet.acquire("g24_spot-0")  # no g24 capacity: the next cheapest class comes up
        assert fleet.settle(10)
        held = FleetLedger(run_dir).held()
        assert list(held) == ["g24_spot-0"] and held["g24_spot-0"].worker_class == fleet.fallbacks["g24_spot"][0]
    finally:
        assert fleet.close() == []
    assert FleetLedger(run_dir).held() == {}
