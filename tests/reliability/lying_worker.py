"""A hostile rollout worker for reliability tests and the chaos benchmark: the real `echo2
worker`, except that its engine swaps every sampled token for a random one and keeps the
log-probs of the tokens it really sampled, as a worker steering training towards text of its
choosing would. Run it as `python -m tests.reliability.lying_worker --coordinator URL ...` (the
arguments of `echo2 worker`)."""

from __future__ import annotations

import random
import sys

import echo2.rollout.worker as worker_module
from echo2.cli import main
from echo2.rollout.engine import Completion

_real_make_engine = worker_module.make_engine


class LyingEngine:
    def __init__(self, engine, vocab_size: int, seed: int = 0) -> None:
        self.engine, self.vocab_size, self.rng = engine, vocab_size, random.Random(seed)

    def __getattr__(self, name):  # weights, swaps and everything else as the real engine does
        return getattr(self.engine, name)

    def generate(self, requests):
        groups = self.engine.generate(requests)
        # the last token (EOS, when the sampler stopped) is kept so completions end normally
        return [[Completion(token_ids=[self.rng.randrange(4, self.vocab_size) for _ in c.token_ids[:-1]]
                            + c.token_ids[-1:], logprobs=c.logprobs) for c in group] for group in groups]


def _lying_make_engine(cfg, source, lora=None):
    engine = _real_make_engine(cfg, source, lora)
    return LyingEngine(engine, engine.model.config.vocab_size)


if __name__ == "__main__":
    worker_module.make_engine = _lying_make_engine
    sys.exit(main(["worker", *sys.argv[1:]]))
