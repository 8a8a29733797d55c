"""A synthetic run's metrics records (what the learner, coordinator and workers write, with the
fields the summary reads), optionally padded with chatter the summary skips, written through
real MetricsWriters, one per role, as the processes of a run do."""

from __future__ import annotations

import random
from pathlib import Path

from echo2.report.metrics import MetricsWriter


def synthetic_run(steps: int, workers: int = 3, chatter_per_step: int = 0, seed: int = 0) -> list[dict]:
    rng = random.Random(seed)
    t = 1000.0
    out: list[dict] = []

    chatter_rng = random.Random(seed + 1)  # chatter changes none of the run's own values or times

    def add(role: str, kind: str, **fields) -> None:
        nonlocal t
        t += rng.random() * 0.1
        out.append({"time": t, "role": role, "kind": kind, **fields})

    def chatter(kind: str, **fields) -> None:
        out.append({"time": t, "role": "coordinator", "kind": kind, **fields})

    add("coordinator", "coordinator_started", url="http://127.0.0.1:1")
    add("learner", "eval", step=0, accuracy=0.3, problems=50, eval_s=0.5)
    for step in range(steps):
        add("learner", "train_step", step=step, wait_s=rng.random(), train_s=0.2, publish_s=0.01,
            staleness_hist={"0": 3, "1": 1}, staleness_max=1, reward_mean=rng.random(), log_ratio_outliers=0,
            peak_memory_bytes=1 << 20, prompt_indices=list(range(step * 4, step * 4 + 4)))
        add("learner", "version_published", version=step + 1, bytes=4096, wire_dtype="float32",
            manifest_digest=f"{step:064x}", publish_s=0.01)
        add("coordinator", "version_published", version=step + 1, broadcast_mode="pipelined", first_hop=["w0"],
            max_depth=2)
        add("learner", "origin_bytes", version=step, total_bytes=4096, bytes_sent=4096 * rng.randint(1, 2))
        for w in range(workers):
            add("worker", "weights_loaded", worker_id=f"w{w}", version=step + 1,
                publish_to_loaded_s=rng.random(), publish_to_verified_s=rng.random() / 2,
                bytes_relayed_previous=rng.randint(0, 4096))
        if step % 5 == 4:
            add("learner", "checkpoint", step=step + 1, checkpoint_s=0.05, path=f"ckpt/{step + 1}")
            add("coordinator", "activation", active=[f"w{w}" for w in range(workers)], reason="enough",
                trigger="", changed=bool(step % 10 == 4), required_rps=1.0, estimates_rps={})
        for _ in range(chatter_per_step):  # what the summary never reads, and a flood is made of
            chatter("lease_requeued", worker_id="w0", reason="worker_timeout",
                    prompt_index=chatter_rng.randint(0, 10**6))
            chatter("bad_peer", version=step, reporter_id="w1", peer_id="w2", url="", chunk_index=0,
                    reason="corrupt_chunk", detail="x" * 900, took_effect=False)
    add("learner", "eval", step=steps, accuracy=0.7, problems=50, eval_s=0.5)
    add("learner", "learner_done", steps=steps)
    add("coordinator", "coordinator_final", counters={"dropped_stale": 2, "leases_expired": 1, "workers_lost": 0},
        workers={f"w{w}": {"tokens_per_s": 100.0 + w} for w in range(workers)}, cost={})
    return out


def write_run(path: Path, records: list[dict], segment_bytes: int) -> None:
    """Each record through the writer of its role; `time` is the record's own."""
    writers: dict[str, MetricsWriter] = {}
    for record in records:
        role = record["role"]
        writer = writers.get(role) or writers.setdefault(role, MetricsWriter(path, role, segment_bytes=segment_bytes))
        writer.write(record["kind"], **{k: v for k, v in record.items() if k not in ("kind", "role")})
    for writer in writers.values():
        writer.close()
