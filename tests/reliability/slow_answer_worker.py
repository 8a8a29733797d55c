"""A hostile rollout worker for the chaos benchmark: the real `echo2 worker`, except that every
completion it returns is an answer math-verify takes seconds to compare (a huge polynomial
power, a factorial of a power, a huge binomial), as a worker trying to stall the coordinator's
scoring would send. Exponent towers are refused before math-verify sees them (tasks/answers.py);
these are not, so they reach the scoring processes, run over `coordinator.scoring.timeout_s`, are
killed, score 0 and count against this worker. Run it as `python -m
tests.reliability.slow_answer_worker --coordinator URL ...` (the arguments of `echo2 worker`)."""

from __future__ import annotations

import sys

import echo2.rollout.worker as worker_module
from echo2.cli import main
from echo2.rollout.engine import Completion

# each takes math-verify about 2 s or more on one core (measured with tasks.answers.equivalent)
SLOW_ANSWERS = (r"\boxed{(x+1)^{999}}", r"\boxed{99^{99}!}", r"\boxed{(x+y+1)^{99}}")

_real_make_engine = worker_module.make_engine


class SlowAnswerEngine:
    def __init__(self, engine) -> None:
        self.engine = engine
        eos = engine.tokenizer.eos_token_id
        self.answers = [engine.tokenizer.encode(text, add_special_tokens=False) + [eos] for text in SLOW_ANSWERS]

    def __getattr__(self, name):  # weights, swaps and everything else as the real engine does
        return getattr(self.engine, name)

    def generate(self, requests, inflight=None):
        out = []
        for req in requests:
            fits = [ids for ids in self.answers if len(ids) <= req.max_new_tokens]
            if not fits:
                raise ValueError(f"sampling.max_new_tokens={req.max_new_tokens} is too short for the slow answers")
            out.append([Completion(token_ids=fits[i % len(fits)], logprobs=[-1.0] * len(fits[i % len(fits)]))
                        for i in range(req.n)])
        return out


def _slow_make_engine(cfg, source, lora=None):
    return SlowAnswerEngine(_real_make_engine(cfg, source, lora))


if __name__ == "__main__":
    worker_module.make_engine = _slow_make_engine
    sys.exit(main(["worker", *sys.argv[1:]]))
