"""The local fleet provider with real processes: the launcher stops a worker the controller idles
(its process exits and it leaves the coordinator as released, not lost), and when the
controller needs it again the launcher starts it, and it rejoins and trains."""

from __future__ import annotations

import json
import os
import signal
import urllib.request

import pytest
from tests.conftest import small_run_config
from tests.integration.runs import OPERATOR_TOKEN, processes, records, wait_for, write_config

from echo2.report.metrics import iter_metrics
from echo2.report.summary import summarize

# the system tier (make test-system): it needs the machine to itself (its waits for the acquired
# worker's groups once ran out beside other tests)
pytestmark = [pytest.mark.integration, pytest.mark.system]


def _launcher(run_dir, kind: str) -> list[dict]:
    return [r for r in records(run_dir, kind) if r["role"] == "launcher"]


@pytest.mark.exclusive  # alone also where the system tier is run under xdist
def test_released_worker_exits_and_an_acquired_one_rejoins_and_trains(tmp_path):
    cfg = small_run_config(
        tmp_path / "fleet", train={"steps": 2000, "max_staleness": 2},  # stopped by the test once seen
        coordinator={"heartbeat_interval_s": 0.3, "worker_timeout_s": 1.5},
        activation={"control_period_s": 0.5, "min_samples": 2, "headroom": 1.0, "scale_down_after_s": 1.0,
                    "provider": "local", "release_after_s": 1.0},
        workers={"count": 3, "per_worker": [{"price_per_hour": p} for p in (1.0, 2.0, 8.0)]},
    )
    config = write_config(tmp_path / "fleet.toml", cfg)
    run_dir = cfg.run_path
    with processes() as start:
        proc = start(["run", "--config", str(config)], tmp_path / "run.log")
        released = wait_for(lambda: _launcher(run_dir, "worker_released"), 150, "a released worker", alive=proc)[0]
        worker_id = released["worker_id"]
        # its process exited (cleanly, after leaving) and the launcher reaped it
        assert released["exit_code"] == 0, released
        with pytest.raises(ProcessLookupError):
            os.kill(released["pid"], 0)
        left = wait_for(lambda: [r for r in records(run_dir, "worker_left") if r["worker_id"] == worker_id], 10,
                        "the coordinator to see it leave")
        assert left[0]["released"] is True
        # once every worker is either active or released, stop the active ones: the controller
        # must choose a released one again (an idle one stopped here would leave as released
        # without the launcher knowing: see the limits in docs/activation.md)
        active = wait_for(lambda: _active_or_released(run_dir), 60, "active or released workers only", alive=proc)
        pids = json.loads((run_dir / "pids.json").read_text())
        for other in active:
            os.kill(pids[f"worker-{other[1:]}"], signal.SIGTERM)
        acquired = wait_for(lambda: _launcher(run_dir, "worker_acquired"), 60, "an acquire", alive=proc)[0]
        back = acquired["worker_id"]
        assert acquired["pid"] != released["pid"] or back != worker_id
        rejoined = wait_for(lambda: [r for r in _launcher(run_dir, "worker_rejoined") if r["worker_id"] == back],
                            60, "the acquired worker to register", alive=proc)[0]
        assert 0 < rejoined["rejoin_s"] < 60

        def trained_after_acquire():
            return [r for r in records(run_dir, "train_step")
                    if r["time"] > acquired["time"] and r["groups_by_worker"].get(back, 0) > 0]

        try:
            wait_for(trained_after_acquire, 150, f"{back}'s groups in a train step after its acquire", alive=proc)
        except AssertionError as exc:
            raise AssertionError(f"{exc}\n{_diagnosis(run_dir, back)}") from None
        bill = _coordinator_state(run_dir)["cost"]["workers"][worker_id]
        assert bill["released_s"] > 0 and bill["idle_s"] > 0  # idle (billed) before its release, then free
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=60) == 130
    state = json.loads((run_dir / "pids.json").read_text())
    assert state[f"worker-{back[1:]}"] == acquired["pid"]  # the acquired process is the one on record
    # the launcher released only idle workers it stopped itself, never one that left by itself
    assert all(r["exit_code"] == 0 for r in _launcher(run_dir, "worker_released"))
    summary = summarize(iter_metrics(run_dir / "metrics.jsonl"))
    assert worker_id in summary["fleet"]["released"] and back in summary["fleet"]["acquired"]
    assert summary["fleet"]["rejoin_s"]["n"] >= 1


def _diagnosis(run_dir, worker_id: str) -> str:
    """What the run did around a worker that never trained after its acquire: the decisions,
    its refusals and the tails of its and the learner's logs."""
    kinds = ("activation", "worker_acquired", "worker_registered", "worker_left", "worker_lost", "worker_refused",
             "batch_assigned")
    rows = [r for r in records(run_dir) if r["kind"] in kinds and r.get("worker_id", worker_id) == worker_id][-30:]
    logs = [run_dir / "logs" / f"worker-{worker_id[1:]}.log", run_dir / "logs" / "learner.log"]
    tails = [f"--- {p.name}\n" + "\n".join(p.read_text(errors="replace").splitlines()[-25:])
             for p in logs if p.is_file()]
    return "\n".join([json.dumps(r)[:400] for r in rows] + tails)


def _active_or_released(run_dir) -> set[str] | None:
    """The active workers, once each worker is active in the latest decision or released."""
    decisions = [r for r in records(run_dir, "activation")]
    released = {r["worker_id"] for r in _launcher(run_dir, "worker_released")}
    registered = {r["worker_id"] for r in records(run_dir, "worker_registered")}
    if not decisions:
        return None
    active = set(decisions[-1]["active"]) - released
    return active if active and active | released == registered else None


def _coordinator_state(run_dir) -> dict:
    url = json.loads((run_dir / "coordinator.json").read_text())["url"]
    request = urllib.request.Request(url + "/v1/state", headers={"Authorization": f"Bearer {OPERATOR_TOKEN}"})
    with urllib.request.urlopen(request, timeout=5) as resp:
        return json.loads(resp.read())


ON_DEMAND_CATALOG = """
[learner]
price_per_hour = 10.0
uplink_bps = 1e9

[workers.cheap]
count = 2
price_per_hour = 1.0
rollouts_per_s = 1000.0
bandwidth_bps = 1e9

[workers.dear]
count = 1
price_per_hour = 8.0
rollouts_per_s = 1000.0
bandwidth_bps = 1e9

[workload]
params = 1e6
prompts_per_step = 4
group_size = 4
step_time_s = 1.0
max_staleness = 2
generation_time_s = 0.5
load_time_s = 0.1
"""


@pytest.mark.exclusive
def test_with_a_catalog_the_launcher_starts_only_the_workers_the_first_decision_chooses(tmp_path):
    """`echo2 run` under the local provider with classed workers: none is started before the
    coordinator's first decision, which picks the catalog's covering set (one cheap worker, each
    of which the catalog rates at many times the learner's demand); the launcher acquires that
    one, the run trains on it to the end, and the others never start, register or bill."""
    catalog = tmp_path / "catalog.toml"
    catalog.write_text(ON_DEMAND_CATALOG)
    cfg = small_run_config(
        tmp_path / "on-demand", train={"steps": 6, "max_staleness": 2},
        activation={"control_period_s": 0.5, "provider": "local", "catalog": str(catalog)},
        workers={"count": 3, "per_worker": [{"price_per_hour": 8.0, "worker_class": "dear"},
                                            {"price_per_hour": 1.0, "worker_class": "cheap"},
                                            {"price_per_hour": 1.0, "worker_class": "cheap"}]},
    )
    config = write_config(tmp_path / "on-demand.toml", cfg)
    with processes() as start:
        proc = start(["run", "--config", str(config)], tmp_path / "run.log")
        assert proc.wait(timeout=300) == 0, (tmp_path / "run.log").read_text()[-3000:]
    run_dir = cfg.run_path
    first = records(run_dir, "activation")[0]
    assert first["active"] == ["w1"], first
    registered = {r["worker_id"] for r in records(run_dir, "worker_registered")}
    acquired = [r["worker_id"] for r in _launcher(run_dir, "worker_acquired")]
    assert registered == {"w1"} and acquired == ["w1"], (registered, acquired)
    assert not (run_dir / "logs" / "worker-0.log").exists() and not (run_dir / "logs" / "worker-2.log").exists()
    assert len(records(run_dir, "train_step")) == 6
    summary = summarize(iter_metrics(run_dir / "metrics.jsonl"))
    by_worker = summary["cost_by_worker"]
    assert by_worker["w1"]["cost"] > 0, by_worker
    assert all(by_worker[w]["cost"] == 0.0 and by_worker[w]["active_s"] == 0.0 for w in ("w0", "w2")), by_worker
