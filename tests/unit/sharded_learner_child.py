"""A learner rank for tests/unit/test_sharded_learner.py, and the settings both sides share.

    torchrun --standalone --nproc-per-node 2 -m tests.unit.sharded_learner_child MODEL_DIR RUN_DIR STEPS OUT \
        [RUN_DIR STEPS OUT ...]

Every rank runs the real Learner, once per (RUN_DIR, STEPS, OUT), one after the other (one
torchrun start, and its ranks' torch imports, for all of them: ~15 s on a 2-core box). The first
Learner starts the process group; the ones after it find it started (init_ranks), and only the
last destroys it: a group destroyed and started again in one torchrun can hang in gloo's
rendezvous (torchrun's store still holds the first group's keys). Rank 0 gets its batches from
StepIO (tests/unit/learner_fakes.py; batch of step t: seed t + 1) and writes what it
published (safetensors payloads) and its audit verdicts to OUT."""

from __future__ import annotations

import json
import sys
from pathlib import Path

from tests.unit.learner_fakes import StepIO, learner_config

from echo2.models.loading import load_tokenizer


def sharded_config(run_dir: Path, model_dir: Path, steps: int):
    # 8 samples of <= 8 tokens, 3 rows a micro-batch: 3 micro-batches, so of 2 ranks one runs a
    # filler pass; the audit recomputes every stale group (tolerance high: the batches' behaviour
    # log-probs are made up) so its sharded path runs too
    return learner_config(run_dir, model_dir, train={"steps": steps, "checkpoint_every": 1},
                          grpo={"micro_batch_tokens": 24},
                          audit={"enabled": True, "recompute_fraction": 1.0, "max_mean_abs_logprob_diff": 1e6})


def write_outputs(io: StepIO, out: Path) -> None:
    out.mkdir(parents=True, exist_ok=True)
    for version, payload in io.published:
        (out / f"v{version}.safetensors").write_bytes(payload)
    verdicts = [[step, [v.model_dump(mode="json") for v in group]] for step, group in io.audits]
    (out / "audits.json").write_text(json.dumps({"asked": io.asked, "audits": verdicts}))


def main(model_dir: str, *jobs: str) -> None:
    from echo2.learner.distributed import Ranks
    from echo2.learner.train import Learner

    assert jobs and len(jobs) % 3 == 0, "expected RUN_DIR STEPS OUT triples"
    triples = list(zip(jobs[::3], jobs[1::3], jobs[2::3], strict=True))
    close = Ranks.close
    try:
        for index, (run_dir, steps, out) in enumerate(triples):
            Ranks.close = close if index == len(triples) - 1 else (lambda self: None)  # the group stays up
            cfg = sharded_config(Path(run_dir), Path(model_dir), int(steps))
            io = StepIO(load_tokenizer(model_dir))
            learner = Learner(cfg, "", learner_token="", io=io)
            leader = learner.leader
            learner.train()
            if leader:
                write_outputs(io, Path(out))
    finally:
        Ranks.close = close


if __name__ == "__main__":
    main(*sys.argv[1:])
