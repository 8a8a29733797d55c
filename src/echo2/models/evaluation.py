"""Held-out evaluation, shared by the learner's in-run evaluation and `echo2 eval`: n completions
per problem (greedy when temperature is 0), each checked by the task, and pass@k for every k
asked for. Prompts are rendered as the workers see them (task messages, chat template)."""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

import torch

from echo2.models.generation import decode_completion, encode_prompts, generate_ids, strip_completion
from echo2.tasks.base import Problem, TaskAdapter, render_prompt
from echo2.tasks.passk import mean_pass_at_k


@dataclass
class EvalReport:
    problems: int
    samples_per_problem: int
    temperature: float
    pass_at_k: dict[int, float]
    seconds: float
    correct_counts: list[int] = field(repr=False, default_factory=list)

    @property
    def accuracy(self) -> float:
        """pass@1: the share of correct completions."""
        return self.pass_at_k[1]

    def to_dict(self) -> dict:
        return {"problems": self.problems, "samples_per_problem": self.samples_per_problem,
                "temperature": self.temperature, "pass_at_k": {str(k): v for k, v in self.pass_at_k.items()},
                "seconds": self.seconds}


def evaluate(model, tokenizer, task: TaskAdapter, problems: Sequence[Problem], *, max_new_tokens: int,
             n: int = 1, temperature: float = 0.0, ks: Sequence[int] = (1,), batch_size: int = 64,
             progress: Callable[[int, int], None] | None = None, synced_ranks: bool = False) -> EvalReport:
    """Evaluate `model` on `problems`; `ks` beyond n are left out, pass@1 is always there.
    `synced_ranks`: the model is sharded over ranks that all evaluate together (each generation
    step gathers weights from every rank, so all keep stepping until the last one is done)."""
    if n < 1 or temperature < 0:
        raise ValueError(f"evaluation needs n >= 1 and temperature >= 0 (got n={n}, temperature={temperature})")
    if n > 1 and temperature == 0:
        raise ValueError("n > 1 greedy completions would all be the same; set a temperature > 0")
    started = time.perf_counter()
    was_training = model.training
    model.eval()
    counts: list[int] = []
    rows = max(1, batch_size // n)
    for start in range(0, len(problems), rows):
        chunk = problems[start:start + rows]
        texts = sample_completions(model, tokenizer, [render_prompt(tokenizer, task, p) for p in chunk], n=n,
                                   temperature=temperature, max_new_tokens=max_new_tokens,
                                   synced_ranks=synced_ranks)
        counts += [sum(task.is_correct(p, t) for t in texts[i * n:(i + 1) * n]) for i, p in enumerate(chunk)]
        if progress is not None:
            progress(len(counts), len(problems))
    model.train(was_training)
    pass_k = {k: mean_pass_at_k(counts, n, k) for k in sorted({1, *ks}) if k <= n}
    return EvalReport(problems=len(problems), samples_per_problem=n, temperature=temperature, pass_at_k=pass_k,
                      seconds=time.perf_counter() - started, correct_counts=counts)


@torch.no_grad()
def sample_completions(model, tokenizer, prompts: Sequence[str], *, n: int, temperature: float,
                       max_new_tokens: int, synced_ranks: bool = False) -> list[str]:
    """n decoded completions per prompt, prompt by prompt; greedy when temperature is 0. Greedy
    single completions take the evaluation leases' road (generate_ids), so `echo2 eval` and a
    worker's evaluation generate alike."""
    if n == 1 and temperature == 0 and not synced_ranks:
        rows = [tokenizer(p, add_special_tokens=False)["input_ids"] for p in prompts]
        ids = generate_ids(model, rows, max_new_tokens=max_new_tokens, temperature=0.0,
                           pad_id=tokenizer.pad_token_id, eos_id=tokenizer.eos_token_id)
        return [decode_completion(tokenizer, row) for row in ids]
    input_ids, attention_mask = encode_prompts(tokenizer, prompts)
    device = next(model.parameters()).device
    sampling = {"do_sample": True, "temperature": temperature, "top_k": 0, "top_p": 1.0} if temperature > 0 else \
        {"do_sample": False}
    out = model.generate(
        input_ids=input_ids.to(device), attention_mask=attention_mask.to(device), max_new_tokens=max_new_tokens,
        num_return_sequences=n, pad_token_id=tokenizer.pad_token_id, eos_token_id=tokenizer.eos_token_id, **sampling,
        synced_gpus=synced_ranks,
    )
    new = out[:, input_ids.shape[1]:].tolist()
    eos, pad = tokenizer.eos_token_id, tokenizer.pad_token_id
    return [decode_completion(tokenizer, strip_completion(row, eos, pad)) for row in new]
