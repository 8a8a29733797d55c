"""Coordinator, learner I/O and two real workers (HF engine, tiny model) in one process over
loopback HTTP: versions are signed, broadcast through the relay chain, verified and loaded;
groups flow into batches; a manifest signed by another key is never loaded."""

from __future__ import annotations

import asyncio
import time

import pytest
import torch
from tests.unit.coordinator_helpers import KEEP_ALIKE, FakeClock, make_state
from tests.unit.test_coordinator_http import LEARNER_TOKEN, TOKEN, _serve

from echo2.broadcast.signing import generate_private_key, sign_manifest
from echo2.config.run import RunConfig
from echo2.config.worker import WorkerConfig
from echo2.coordinator.http.base import NEWS_KEY
from echo2.coordinator.records.errors import RequestError
from echo2.learner.io import LearnerIO
from echo2.models.loading import load_model
from echo2.models.weights import model_payload
from echo2.protocol.manifest import TensorEntry, build_manifest
from echo2.protocol.messages import VersionInfo
from echo2.report.metrics import MetricsWriter, read_metrics
from echo2.rollout.worker import Worker


async def _until(predicate, timeout_s: float = 30.0) -> None:
    deadline = asyncio.get_running_loop().time() + timeout_s
    while not predicate():
        assert asyncio.get_running_loop().time() < deadline, "condition not reached in time"
        await asyncio.sleep(0.05)


def test_publish_broadcast_generate_batch(tmp_path, tiny_model_dir):
    state = make_state(tmp_path, tiny_model_dir, FakeClock(), max_staleness=1, groups_per_step=2, rewards=KEEP_ALIKE)
    metrics_path = tmp_path / "metrics.jsonl"
    model = load_model(str(tiny_model_dir))
    cfg = RunConfig(run_dir=str(tmp_path / "run"))

    async def main():
        runner, url = await _serve(state, max_request_bytes=1 << 20)
        io = LearnerIO(cfg, url, LEARNER_TOKEN, TOKEN)
        await asyncio.to_thread(io.start)
        workers = [Worker(WorkerConfig(worker_id=w, tasks_per_lease=1), url, TOKEN,
                          MetricsWriter(metrics_path, "worker"))
                   for w in ("w1", "w2")]
        stop = asyncio.Event()
        try:
            await asyncio.to_thread(io.publish, 0, model_payload(model))
            running = [asyncio.create_task(w.run(stop)) for w in workers]
            batch0 = await asyncio.to_thread(io.fetch_batch, 0, wait_s=20.0)
            await _until(lambda: all(w.version == 0 for w in workers))
            with torch.no_grad():
                for p in model.parameters():
                    p.mul_(0.5)
            await asyncio.to_thread(io.publish, 1, model_payload(model))
            await _until(lambda: all(w.version == 1 for w in workers))
            loaded = [{k: v.clone() for k, v in w.engine.model.state_dict().items()} for w in workers]
            batch1 = await asyncio.to_thread(io.fetch_batch, 1, wait_s=20.0)
            forge(state, io)  # version 2, signed by a key that is not the learner's
            runner.app[NEWS_KEY].announce(version=True)  # and told to every worker's news line
            await asyncio.sleep(1.5)
            after_forgery = [w.version for w in workers]
            stop.set()
            await asyncio.wait_for(asyncio.gather(*running), timeout=30)
            return batch0, batch1, loaded, after_forgery, io
        finally:
            stop.set()
            await asyncio.to_thread(io.close)
            await runner.cleanup()

    batch0, batch1, loaded, after_forgery, io = asyncio.run(asyncio.wait_for(main(), timeout=120))
    assert len(batch0) == 2 and all(g.version == 0 and len(g.completions) == 2 for g in batch0)
    assert all(0 <= 1 - g.version <= 1 for g in batch1)
    for engine_state in loaded:
        for name, tensor in model.state_dict().items():
            assert torch.equal(engine_state[name], tensor), name
    assert after_forgery == [1, 1]
    records = read_metrics(metrics_path)
    rejected = [r for r in records if r["kind"] == "weights_fetch_failed" and r["version"] == 2]
    assert rejected and all("manifest rejected" in r["error"] for r in rejected)
    loads = [r for r in records if r["kind"] == "weights_loaded"]
    assert sorted((r["worker_id"], r["version"]) for r in loads) == [("w1", 0), ("w1", 1), ("w2", 0), ("w2", 1)]
    # equal links make a chain: one worker is fed by the learner, the other by that worker
    sources = {r["worker_id"]: set(r["bytes_by_source"]) for r in loads if r["version"] == 1}
    assert sorted(map(sorted, sources.values())) == [["origin"], ["w1"]] or sorted(
        map(sorted, sources.values())) == [["origin"], ["w2"]]
    assert all(r["publish_to_loaded_s"] >= r["publish_to_verified_s"] > 0 for r in loads)
    assert not any(state.registry.workers[w].alive for w in ("w1", "w2"))  # both left cleanly on stop


def forge(state, io: LearnerIO) -> None:
    """A version 2 signed by another key. The coordinator refuses it; planted and announced
    anyway (as a compromised coordinator would), the workers refuse it too."""
    payload = b"\0" * 64
    content = [TensorEntry(name="x", dtype="BF16", shape=[1], start=62, end=64, sha256="0" * 64)]
    manifest = build_manifest(2, payload, 16, base_version=1, codec="sub-zstd", content=content, content_bytes=64,
                              published_at=time.time())
    signed = sign_manifest(manifest, generate_private_key())
    info = VersionInfo(version=2, signed=signed, origin_url=io.origin_url, published_at=time.time())
    with pytest.raises(RequestError, match="publish of version 2 refused"):
        state.learner_desk.publish(info, state.versions.public_key_hex)
    state.versions.dissemination.plan_version(2, info.origin_url, state.registry.peers())
    state.versions.dissemination.published(info, restarted=False)
    state.versions.latest = info
