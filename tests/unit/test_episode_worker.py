"""A real worker (HF engine, tiny model) playing poker episodes against a coordinator over
loopback HTTP: it learns the task from its registration, plays G episodes per lease from the
lease's episode seed, drawing every action with the lease's sampler seed, and the coordinator
accepts the transcripts after replaying every one of them; the learner's sampler audit finds
every action the seed's choice."""

from __future__ import annotations

import asyncio

from tests.unit.coordinator_helpers import KEEP_ALIKE, FakeClock, make_state
from tests.unit.test_coordinator_http import LEARNER_TOKEN, TOKEN, _serve
from tests.unit.test_loopback_pipeline import _until

from echo2.config.run import RunConfig, load_run_config
from echo2.config.worker import WorkerConfig
from echo2.coordinator.scoring.scorer import make_scorer
from echo2.envs.episode import replay
from echo2.learner.batching import loss_mask
from echo2.learner.io import LearnerIO
from echo2.learner.sampler_audit import group_shortfalls
from echo2.models.loading import load_model, load_tokenizer
from echo2.models.weights import model_payload
from echo2.protocol.messages import SamplingParams
from echo2.report.metrics import MetricsWriter
from echo2.rollout.worker import Worker
from echo2.tasks import make_task


def test_a_worker_plays_episodes_the_coordinator_replays(tmp_path, tiny_model_dir):
    cfg = load_run_config(None, ["task.name=poker", "task.game=leduc", "task.opponent=calling_station",
                                 "task.max_episode_tokens=200"])
    task = make_task(cfg.task, cfg.seed)
    sampling = SamplingParams(temperature=1.0, max_new_tokens=3, group_size=3)
    state = make_state(tmp_path, tiny_model_dir, FakeClock(), max_staleness=1, groups_per_step=2, sampling=sampling,
                       scorer=make_scorer(task, str(tiny_model_dir), sampling.max_new_tokens), rewards=KEEP_ALIKE)
    model = load_model(str(tiny_model_dir))

    async def main():
        runner, url = await _serve(state, max_request_bytes=1 << 20)
        io = LearnerIO(RunConfig(run_dir=str(tmp_path / "run")), url, LEARNER_TOKEN, TOKEN)
        await asyncio.to_thread(io.start)
        worker = Worker(WorkerConfig(worker_id="w1", tasks_per_lease=2), url, TOKEN,
                        MetricsWriter(tmp_path / "metrics.jsonl", "worker"))
        stop = asyncio.Event()
        try:
            await asyncio.to_thread(io.publish, 0, model_payload(model))
            running = asyncio.create_task(worker.run(stop))
            batch = await asyncio.to_thread(io.fetch_batch, 0, wait_s=60.0)
            await _until(lambda: worker.stats["tasks"] >= 2)
            stop.set()
            await asyncio.wait_for(running, timeout=60)
            return batch, worker
        finally:
            stop.set()
            await asyncio.to_thread(io.close)
            await runner.cleanup()

    batch, worker = asyncio.run(asyncio.wait_for(main(), timeout=180))
    assert worker.episodes is not None and worker.stats["dropped"] == 0
    assert len(batch) == 2
    codec = state.scorer.codec
    pad = load_tokenizer(str(tiny_model_dir)).pad_token_id
    for group in batch:
        seed = task.train_seed(group.prompt_index)
        assert len(group.completions) == 3
        assert group.sampling_seed == state.leases_book.seed_of(group.lease_id)
        shortfalls = group_shortfalls(model, None, group, temperature=1.0, pad_id=pad)
        assert len(shortfalls) == sum(sum(loss_mask(c)) for c in group.completions) and float(shortfalls.max()) < 1e-4
        for completion, reward in zip(group.completions, group.rewards, strict=True):
            assert completion.segments and sum(completion.segments) == len(completion.token_ids)
            # the tiny untrained model writes anything: most hands end at once, illegally
            again = replay(task.episode(codec, seed, sampling.max_new_tokens), completion.token_ids,
                           completion.segments)
            assert again.reward == reward
            masked = [lp for lp, m in zip(completion.logprobs, loss_mask(completion), strict=True) if not m]
            assert all(lp == 0.0 for lp in masked)
            assert all(lp < 0 for lp, m in zip(completion.logprobs, loss_mask(completion), strict=True) if m)
