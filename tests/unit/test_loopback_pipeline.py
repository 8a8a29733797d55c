"""Coordinator, learner I/O and a real worker (HF engine, tiny model) in one process over
loopback HTTP: weights are published, fetched, verified and loaded; groups flow into batches;
a tampered payload is never loaded."""

from __future__ import annotations

import asyncio

import torch
from tests.unit.coordinator_helpers import FakeClock, make_state
from tests.unit.test_coordinator_http import TOKEN, _serve

from echo2.config.worker import WorkerConfig
from echo2.learner.io import LearnerIO
from echo2.models.loading import load_model
from echo2.models.weights import state_dict_to_bytes
from echo2.report.metrics import MetricsWriter, read_metrics
from echo2.rollout.worker import Worker


async def _until(predicate, timeout_s: float = 30.0) -> None:
    deadline = asyncio.get_running_loop().time() + timeout_s
    while not predicate():
        assert asyncio.get_running_loop().time() < deadline, "condition not reached in time"
        await asyncio.sleep(0.05)


def test_publish_fetch_generate_batch(tmp_path, tiny_model_dir):
    state = make_state(tmp_path, tiny_model_dir, FakeClock(), max_staleness=1, groups_per_step=2)
    metrics_path = tmp_path / "metrics.jsonl"
    model = load_model(str(tiny_model_dir))

    async def main():
        runner, url = await _serve(state, max_request_bytes=1 << 20)
        io = LearnerIO(url, TOKEN, "127.0.0.1", 0, keep_versions=2, request_timeout_s=10)
        await asyncio.to_thread(io.start)
        worker = Worker(WorkerConfig(worker_id="w1", tasks_per_lease=1), url, TOKEN,
                        MetricsWriter(metrics_path, "worker"))
        stop = asyncio.Event()
        try:
            await asyncio.to_thread(io.publish, 0, state_dict_to_bytes(model), 4096)
            running = asyncio.create_task(worker.run(stop))
            batch0 = await asyncio.to_thread(io.fetch_batch, 0, 20.0)
            with torch.no_grad():
                for p in model.parameters():
                    p.mul_(0.5)
            await asyncio.to_thread(io.publish, 1, state_dict_to_bytes(model), 4096)
            await _until(lambda: worker.version == 1)
            loaded = {k: v.clone() for k, v in worker.engine.model.state_dict().items()}
            batch1 = await asyncio.to_thread(io.fetch_batch, 1, 20.0)
            # version 2's bytes are tampered after the manifest was built: never loaded
            await asyncio.to_thread(io.publish, 2, state_dict_to_bytes(model), 4096)
            io.loop.call_soon_threadsafe(lambda: io.versions.__setitem__(2, b"\0" * len(io.versions[2])))
            await asyncio.sleep(1.5)
            version_after_tamper = worker.version
            stop.set()
            await asyncio.wait_for(running, timeout=30)
            return batch0, batch1, loaded, version_after_tamper
        finally:
            stop.set()
            await asyncio.to_thread(io.close)
            await runner.cleanup()

    batch0, batch1, loaded, version_after_tamper = asyncio.run(asyncio.wait_for(main(), timeout=120))
    assert len(batch0) == 2 and all(g.version == 0 and len(g.completions) == 2 for g in batch0)
    assert all(0 <= 1 - g.version <= 1 for g in batch1)
    for name, tensor in model.state_dict().items():
        assert torch.equal(loaded[name], tensor), name
    assert version_after_tamper == 1
    records = read_metrics(metrics_path)
    assert any(r["kind"] == "weights_fetch_failed" and r["version"] == 2 for r in records)
    assert [r["version"] for r in records if r["kind"] == "weights_loaded"] == [0, 1]
    assert not state.workers["w1"].alive  # it left cleanly on stop
