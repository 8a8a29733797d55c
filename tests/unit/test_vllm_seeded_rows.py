"""The vLLM engine's seeded logits processor, without vLLM (rollout/vllm_sampler.py): each seeded
row of a batch keeps only the seeded sampler's token, holding its log-prob under
softmax(logits / T), at the sample index and position its request names (the position follows
vLLM's live list of output tokens); other rows are left alone. `make test-vllm` runs it inside
vLLM against the learner."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch

from echo2.models.sampler import choose, draw
from echo2.rollout.vllm_sampler import EXTRA_KEY, SeededRows, seeded_row

VOCAB = 50


def _params(seed: int, sample: int, first_position: int, temperature: float, *, greedy: bool = True):
    """What vLLM hands a processor for a seeded request (SamplingParams' fields it reads)."""
    spec = {"seed": seed, "sample": sample, "first_position": first_position, "temperature": temperature}
    return SimpleNamespace(extra_args={EXTRA_KEY: spec}, temperature=0.0 if greedy else temperature)


def test_draw_is_the_seeded_samplers_choice_row_by_row():
    logits = torch.randn(4, VOCAB, generator=torch.Generator().manual_seed(0))
    seeds, temperatures = [3, 3, 9, 2**32 - 1], [1.0, 0.7, 1.0, 1.3]
    samples, positions = torch.tensor([0, 1, 0, 5]), torch.tensor([0, 0, 4, 2])
    tokens, logprobs = draw(logits, torch.tensor(temperatures, dtype=torch.float64), torch.tensor(seeds),
                            samples_N=samples, positions_N=positions)
    for r in range(4):
        alone = choose(logits[r: r + 1], temperatures[r], seeds[r], samples_N=samples[r: r + 1],
                       positions_N=positions[r: r + 1])
        assert int(tokens[r]) == int(alone)
        expected = torch.log_softmax(logits[r].double() / temperatures[r], dim=-1)[tokens[r]]
        assert float(logprobs[r]) == pytest.approx(float(expected), abs=1e-12)


def test_seeded_rows_keep_the_samplers_token_with_its_logprob_and_leave_the_rest():
    processor = SeededRows()
    outputs = [[], [11, 12]]  # vLLM's running output lists: row 2 has drawn two tokens already
    processor.rows = {0: seeded_row(_params(7, 3, 0, 0.7), None, outputs[0]),
                      2: seeded_row(_params(8, 0, 5, 1.0), None, outputs[1])}
    assert seeded_row(SimpleNamespace(extra_args=None, temperature=0.0), None, []) is None  # evaluation's rows
    logits = torch.randn(3, VOCAB, generator=torch.Generator().manual_seed(1))
    out = processor.apply(logits.clone())
    assert torch.equal(out[1], logits[1])
    for row, (seed, sample, position, temperature) in {0: (7, 3, 0, 0.7), 2: (8, 0, 7, 1.0)}.items():
        token = int(choose(logits[row: row + 1], temperature, seed, samples_N=torch.tensor([sample]),
                           positions_N=torch.tensor([position])))
        assert int(out[row].argmax()) == token and int(torch.isfinite(out[row]).sum()) == 1
        expected = torch.log_softmax(logits[row].double() / temperature, dim=-1)[token]
        assert float(out[row, token]) == pytest.approx(float(expected), abs=1e-6)
    # the next step: one more output token, so the noise moves to the next position
    outputs[0].append(int(out[0].argmax()))
    nxt = processor.apply(logits.clone())
    assert int(nxt[0].argmax()) == int(choose(logits[:1], 0.7, 7, samples_N=torch.tensor([3]),
                                              positions_N=torch.tensor([1])))


def test_an_empty_batch_is_left_as_it_is():
    logits = torch.randn(2, VOCAB)
    assert SeededRows().apply(logits) is logits


def test_a_seeded_request_must_run_greedy():
    SeededRows.validate_params(_params(1, 0, 0, 1.0))
    SeededRows.validate_params(SimpleNamespace(extra_args=None, temperature=0.8))  # not ours
    with pytest.raises(ValueError, match="temperature 0"):
        SeededRows.validate_params(_params(1, 0, 0, 1.0, greedy=False))
    assert SeededRows().is_argmax_invariant() is False  # so vLLM applies it before greedy decoding
