"""Delta versions end to end, in one process over loopback HTTP: the learner's I/O publishes
deltas and anchors, the coordinator plans each worker's fetches, and real workers (HF engine,
tiny model) rebuild every version bit for bit: one following along through the relay tree, one
joining late from the newest anchor plus the deltas after it."""

from __future__ import annotations

import asyncio

import torch
from tests.unit.coordinator_helpers import KEEP_ALIKE, FakeClock, make_state
from tests.unit.test_coordinator_http import LEARNER_TOKEN, TOKEN, _serve
from tests.unit.test_loopback_pipeline import _until

from echo2.config.broadcast import BroadcastConfig
from echo2.config.run import RunConfig
from echo2.config.worker import WorkerConfig
from echo2.learner.io import LearnerIO
from echo2.models.loading import load_model
from echo2.models.weights import model_payload
from echo2.report.metrics import MetricsWriter, read_metrics
from echo2.rollout.worker import Worker

BROADCAST = BroadcastConfig(deltas=True, anchor_every=3, chunk_bytes=4096)


def _step(model: torch.nn.Module, generator: torch.Generator) -> None:
    """An Adam-sized step at an RL learning rate: every weight moves by 2e-5, which changes a
    few percent of them once cast to bf16."""
    with torch.no_grad():
        for p in model.parameters():
            p.add_(2e-5 * torch.sign(torch.randn(p.shape, generator=generator)))


def _holding(w: Worker) -> int:
    """Newest version the worker holds in full (-1 before its follower starts)."""
    return w.follower.holding() if w.follower is not None else -1


def test_a_follower_and_a_late_joiner_rebuild_every_version(tmp_path, tiny_model_dir):
    state = make_state(tmp_path, tiny_model_dir, FakeClock(), max_staleness=10, groups_per_step=1, broadcast=BROADCAST,
                       rewards=KEEP_ALIKE)
    metrics_path = tmp_path / "metrics.jsonl"
    model = load_model(str(tiny_model_dir))
    generator = torch.Generator().manual_seed(0)
    cfg = RunConfig(run_dir=str(tmp_path / "run"), broadcast=BROADCAST)

    def worker(worker_id: str) -> Worker:
        return Worker(WorkerConfig(worker_id=worker_id, tasks_per_lease=1), url, TOKEN,
                      MetricsWriter(metrics_path, "worker"))

    async def main():
        nonlocal url
        runner, url = await _serve(state, max_request_bytes=1 << 20)
        io = LearnerIO(cfg, url, LEARNER_TOKEN, TOKEN)
        await asyncio.to_thread(io.start)
        stop = asyncio.Event()
        running = []
        try:
            infos = [await asyncio.to_thread(io.publish, 0, model_payload(model, torch.bfloat16))]
            follower = worker("follower")
            running.append(asyncio.create_task(follower.run(stop)))
            for version in range(1, 5):
                await _until(lambda v=version: _holding(follower) == v - 1)
                _step(model, generator)
                infos.append(await asyncio.to_thread(io.publish, version, model_payload(model, torch.bfloat16)))
            await _until(lambda: _holding(follower) == 4)
            joiner = worker("joiner")
            running.append(asyncio.create_task(joiner.run(stop)))
            await _until(lambda: _holding(joiner) == 4 and joiner.version == 4 and follower.version == 4)
            loaded = [{k: v.clone() for k, v in w.engine.model.state_dict().items()} for w in (follower, joiner)]
            stop.set()
            await asyncio.wait_for(asyncio.gather(*running), timeout=30)
            return infos, loaded
        finally:
            stop.set()
            await asyncio.to_thread(io.close)
            await runner.cleanup()

    url = ""
    infos, loaded = asyncio.run(asyncio.wait_for(main(), timeout=180))
    forms = [(i.signed.unverified_manifest().form, i.full is not None) for i in infos]
    assert forms == [("full", False), ("delta", False), ("delta", False), ("delta", True), ("delta", False)]
    for engine_state in loaded:  # bit for bit what the learner published (its weights on the bf16 wire)
        for name, tensor in model.state_dict().items():
            assert torch.equal(engine_state[name], tensor.bfloat16().float()), name
    full_bytes = infos[0].signed.unverified_manifest().total_bytes
    loads = [r for r in read_metrics(metrics_path) if r["kind"] == "weights_loaded"]
    follower_bytes = {r["version"]: r["bytes"] for r in loads if r["worker_id"] == "follower"}
    # every version after the first came as a delta (a swap may skip a version staged over)
    assert follower_bytes[0] == full_bytes and 4 in follower_bytes
    assert all(n < full_bytes / 3 for v, n in follower_bytes.items() if v > 0)
    # the late joiner took the anchor (version 3 in full: nobody had asked for it, so the origin
    # served it) and then version 4 as a delta, rebuilt from the anchor
    joiner = [r for r in loads if r["worker_id"] == "joiner"]
    assert joiner[-1]["version"] == 4 and joiner[-1]["bytes"] == follower_bytes[4]
    assert all(r["bytes"] == full_bytes and r["bytes_by_source"] == {"origin": full_bytes}
               for r in joiner if r["version"] == 3)
