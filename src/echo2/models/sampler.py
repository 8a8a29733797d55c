"""The seeded sampler: the one way a worker may draw its tokens, so the learner can check that
it did.

Gumbel-max: the token at completion position p of sample s of a lease with seed k is

    argmax_v  logits_v / T + g(k, s, p, v),    g = -log(-log(u)),  u = hash(k, s, p, v) in (0, 1)

which is an exact draw from softmax(logits / T) (the Gumbel-max trick), and whose noise anyone
holding (k, s, p) can recompute. The hash is counter-based integer arithmetic (Wellons'
lowbias32 mixer on 32-bit lanes), written so no product overflows 64 bits: the same noise on any
device, in any framework. The coordinator draws k for each lease; a worker that chooses its
tokens (the right answers, say) and reports their true log-probs passes the log-prob audit, but
not this one: at a position where its token is not the argmax, the learner, recomputing the
logits under the claimed version, sees it."""

from __future__ import annotations

import torch

_MASK32 = 0xFFFFFFFF
_SEED_BITS = 32
_UNIFORM_BITS = 24  # of the hash's 32: exact in float32 and float64 alike


def _mul32(x: torch.Tensor, constant: int) -> torch.Tensor:
    """(x * constant) mod 2^32 for x < 2^32, in 16-bit halves: no intermediate reaches 2^63."""
    low = x * (constant & 0xFFFF)
    high = ((x * (constant >> 16)) & 0xFFFF) << 16
    return (low + high) & _MASK32


def mix32(x: torch.Tensor) -> torch.Tensor:
    """Wellons' lowbias32 integer hash of each 32-bit value (int64 tensors)."""
    x = x & _MASK32
    x = x ^ (x >> 16)
    x = _mul32(x, 0x7FEB352D)
    x = x ^ (x >> 15)
    x = _mul32(x, 0x846CA68B)
    return x ^ (x >> 16)


def check_seed(seed: int) -> int:
    if not 0 <= seed < 2**_SEED_BITS:
        raise ValueError(f"sampling seed {seed} is not a {_SEED_BITS}-bit unsigned integer")
    return seed


def gumbel_noise(seed: int | torch.Tensor, samples_N: torch.Tensor, positions_N: torch.Tensor,
                 vocab: int) -> torch.Tensor:
    """(N, vocab) float64 Gumbel noise for the tokens at (sample, position) of a lease's seed, or
    of each row's own lease: `seed` an (N,) tensor of 32-bit seeds (checked by the caller, as
    they arrive: checking here would wait on the device every step)."""
    device = samples_N.device
    seeds = seed.long() if isinstance(seed, torch.Tensor) else check_seed(seed)
    row = mix32(mix32(samples_N.long() + 0x9E3779B9) ^ mix32(positions_N.long() + 0x85EBCA6B) ^ seeds)
    columns = mix32(torch.arange(vocab, device=device, dtype=torch.long) + 0xC2B2AE35)
    bits = mix32(row[:, None] ^ columns[None, :]) >> (32 - _UNIFORM_BITS)
    uniform = (bits.double() + 0.5) / 2**_UNIFORM_BITS
    return -torch.log(-torch.log(uniform))


def perturbed(logits_NV: torch.Tensor, temperature: float, seed: int, *, samples_N: torch.Tensor,
              positions_N: torch.Tensor) -> torch.Tensor:
    """logits / T + Gumbel noise, float64: the sampler's token is its argmax."""
    if temperature <= 0:
        raise ValueError("the seeded sampler needs sampling.temperature > 0 (0 is greedy: nothing to seed)")
    noise = gumbel_noise(seed, samples_N, positions_N, logits_NV.shape[-1])
    return logits_NV.double() / temperature + noise


def choose(logits_NV: torch.Tensor, temperature: float, seed: int, *, samples_N: torch.Tensor,
           positions_N: torch.Tensor) -> torch.Tensor:
    """The tokens the seeded sampler draws at each (sample, position)."""
    return perturbed(logits_NV, temperature, seed, samples_N=samples_N, positions_N=positions_N).argmax(dim=-1)


def shortfall(logits_NV: torch.Tensor, tokens_N: torch.Tensor, temperature: float, seed: int, *,
              samples_N: torch.Tensor, positions_N: torch.Tensor) -> torch.Tensor:
    """(N,) how far each token's perturbed score falls below the best one (0: the sampler's own
    choice). An honest engine's tokens fall short only by its numeric differences from the
    logits this is computed with, and only at near-ties."""
    scores = perturbed(logits_NV, temperature, seed, samples_N=samples_N, positions_N=positions_N)
    return scores.max(dim=-1).values - scores.gather(-1, tokens_N.long()[:, None]).squeeze(-1)


def draw(logits_NV: torch.Tensor, temperatures_N: torch.Tensor, seeds_N: torch.Tensor, *, samples_N: torch.Tensor,
         positions_N: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Rows of several leases at once (an engine's batch): each row's token, the argmax of
    `perturbed` under its own temperature and seed, and that token's log-prob under
    softmax(logits / T), the distribution it was drawn from (the behaviour log-prob)."""
    scaled = logits_NV.double() / temperatures_N.double()[:, None]
    tokens = (scaled + gumbel_noise(seeds_N, samples_N, positions_N, logits_NV.shape[-1])).argmax(dim=-1)
    logprobs = torch.log_softmax(scaled, dim=-1).gather(-1, tokens[:, None]).squeeze(-1)
    return tokens, logprobs
