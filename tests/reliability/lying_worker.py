"""A hostile rollout worker for reliability tests and the chaos benchmark: the real `echo2
worker`, except that its engine lies about its tokens, as a worker steering training towards
text of its choosing would. Two lies (`ECHO2_LIE`):
- "random" (the default): every sampled token swapped for a random one, the log-probs of the
  tokens it really sampled kept: the log-prob comparison catches it;
- "choose": the tokens it likes best (greedy completions), with their true log-probs under the
  version it holds: the log-prob comparison cannot tell, the seeded sampler's check can.
Run it as `python -m tests.reliability.lying_worker --coordinator URL ...` (the arguments of
`echo2 worker`)."""

from __future__ import annotations

import os
import random
import sys

import torch

import echo2.rollout.worker as worker_module
from echo2.cli import main
from echo2.rollout.engine import Completion

_real_make_engine = worker_module.make_engine


class LyingEngine:
    def __init__(self, engine, vocab_size: int, seed: int = 0) -> None:
        self.engine, self.vocab_size, self.rng = engine, vocab_size, random.Random(seed)

    def __getattr__(self, name):  # weights, swaps and everything else as the real engine does
        return getattr(self.engine, name)

    def generate(self, requests, inflight=None):
        groups = self.engine.generate(requests)
        # the last token (EOS, when the sampler stopped) is kept so completions end normally
        return [[Completion(token_ids=[self.rng.randrange(4, self.vocab_size) for _ in c.token_ids[:-1]]
                            + c.token_ids[-1:], logprobs=c.logprobs) for c in group] for group in groups]


class ChoosingEngine(LyingEngine):
    def generate(self, requests, inflight=None):
        return [[self._chosen(req) for _ in range(req.n)] for req in requests]

    @torch.no_grad()
    def _chosen(self, req) -> Completion:
        ids = self.engine.greedy([req.prompt_ids], req.max_new_tokens)[0]
        model = self.engine.model
        logits = model(torch.tensor([req.prompt_ids + ids], device=model.device)).logits[0].float()
        logp = torch.log_softmax(logits / req.temperature, dim=-1)
        start = len(req.prompt_ids) - 1
        return Completion(token_ids=ids, logprobs=[float(logp[start + j, t]) for j, t in enumerate(ids)])


def _lying_make_engine(cfg, source, lora=None):
    engine = _real_make_engine(cfg, source, lora)
    lie = ChoosingEngine if os.environ.get("ECHO2_LIE", "random") == "choose" else LyingEngine
    return lie(engine, engine.model.config.vocab_size)


if __name__ == "__main__":
    worker_module.make_engine = _lying_make_engine
    sys.exit(main(["worker", *sys.argv[1:]]))
