"""Per-token log-probs of completions under the current model, aligned with the behaviour
log-probs the workers returned, without ever holding full-vocabulary logits for the batch.

A micro-batch's rows run through the transformer body once; only the hidden states that predict
a completion token are kept ([N, H], N completion tokens), and the LM head turns them into
log-probs `logprob_chunk_tokens` at a time inside one autograd function that recomputes each
chunk's logits in the backward pass. Peak logit memory is one chunk's [n, V], whatever B and T
are: B = 128 completions of 1,024 tokens with Qwen3's 151,936-token vocabulary would otherwise
be 80 GB of fp32 logits.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch


@dataclass
class MicroBatch:
    """Right-padded prompt+completion rows and, flattened over every completion token, which
    row and position predicts it and which sample of the step it belongs to."""

    input_ids_BL: torch.Tensor
    attention_mask_BL: torch.Tensor | None
    """None for packed rows (`learner.passes`): the positions say where each sequence starts."""
    rows_N: torch.Tensor
    cols_N: torch.Tensor
    """Position whose output predicts the token: the token at position p is predicted at p - 1."""
    targets_N: torch.Tensor
    sample_N: torch.Tensor
    """Index of the token's sample in the step's flat list of samples."""
    position_ids_BL: torch.Tensor | None = None
    """Packed rows only: each token's position in its own sequence."""

    @property
    def num_tokens(self) -> int:
        return int(self.targets_N.numel())

    def to(self, device: torch.device) -> MicroBatch:
        return MicroBatch(*(None if t is None else t.to(device, non_blocking=True) for t in (
            self.input_ids_BL, self.attention_mask_BL, self.rows_N, self.cols_N, self.targets_N, self.sample_N,
            self.position_ids_BL)))

    def model_inputs(self) -> dict:
        inputs = {"input_ids": self.input_ids_BL, "attention_mask": self.attention_mask_BL}
        if self.position_ids_BL is not None:
            inputs["position_ids"] = self.position_ids_BL
        return inputs


def collate(prompts: list[list[int]], completions: list[list[int]], sample_ids: list[int], pad_id: int) -> MicroBatch:
    rows = [p + c for p, c in zip(prompts, completions, strict=True)]
    width = max(len(r) for r in rows)
    lens = torch.tensor([len(r) for r in rows])
    where_rows, where_cols, targets, samples = [], [], [], []
    for row, (prompt, completion) in enumerate(zip(prompts, completions, strict=True)):
        n = len(completion)
        where_rows += [row] * n
        where_cols += range(len(prompt) - 1, len(prompt) - 1 + n)
        targets += completion
        samples += [sample_ids[row]] * n
    return MicroBatch(
        input_ids_BL=torch.tensor([r + [pad_id] * (width - len(r)) for r in rows]),
        attention_mask_BL=(torch.arange(width)[None, :] < lens[:, None]).long(),
        rows_N=torch.tensor(where_rows, dtype=torch.long),
        cols_N=torch.tensor(where_cols, dtype=torch.long),
        targets_N=torch.tensor(targets, dtype=torch.long),
        sample_N=torch.tensor(samples, dtype=torch.long),
    )


def lean_head_supported(model) -> bool:
    """The chunked head needs logits = hidden @ W^T from a plain bias-free linear head; models
    that scale or soft-cap their logits (Gemma 2, Cohere, Granite) take the full-logits path."""
    head = model.get_output_embeddings() if hasattr(model, "get_output_embeddings") else None
    config = getattr(model, "config", None)
    scaled = any(getattr(config, name, None) for name in ("final_logit_softcapping", "logit_scale", "logits_scaling"))
    return (isinstance(head, torch.nn.Linear) and head.bias is None and not scaled
            and getattr(model, "base_model", model) is not model)


# a model sharded with FSDP (learner/sharding.py) carries lean_logprobs as this method, wrapped
# so that its root parameters are gathered around the call
SHARDED_LEAN_METHOD = "echo2_lean_logprobs"


def token_logprobs(model, mb, temperature: float, chunk_tokens: int) -> tuple[torch.Tensor, torch.Tensor]:
    """log pi(token | prefix) of every completion token of the micro-batch ([N], fp32, with
    gradients) and the entropy of the distribution it was drawn from ([N], fp32, none). `mb` is
    a MicroBatch (padded or packed rows) or a SharedMicroBatch (prompts computed once)."""
    from echo2.learner.shared_prefix import SharedMicroBatch, shared_hidden_states

    if isinstance(mb, SharedMicroBatch):
        hidden_NH = shared_hidden_states(model, mb)
        return head_logprobs(hidden_NH, model.get_output_embeddings().weight, mb.targets_N,
                             temperature=temperature, chunk_tokens=chunk_tokens)
    if lean_head_supported(model):
        sharded = getattr(model, SHARDED_LEAN_METHOD, None)
        return (sharded(mb, temperature, chunk_tokens) if sharded
                else lean_logprobs(model, mb, temperature, chunk_tokens))
    logits = model(**mb.model_inputs(), use_cache=False).logits
    return logits_logprobs(logits[mb.rows_N, mb.cols_N], mb.targets_N, temperature, chunk_tokens)


def lean_logprobs(model, mb: MicroBatch, temperature: float, chunk_tokens: int) -> tuple[torch.Tensor, torch.Tensor]:
    """The transformer body, then the LM head on the hidden states that predict completion tokens."""
    out = model.base_model(**mb.model_inputs(), use_cache=False)
    hidden_NH = out.last_hidden_state[mb.rows_N, mb.cols_N]
    return head_logprobs(hidden_NH, model.get_output_embeddings().weight, mb.targets_N,
                         temperature=temperature, chunk_tokens=chunk_tokens)


def logits_logprobs(logits_NV: torch.Tensor, targets_N: torch.Tensor, temperature: float,
                    chunk_tokens: int) -> tuple[torch.Tensor, torch.Tensor]:
    """The same from logits the model already produced (plain autograd, chunked in fp32)."""
    logp, entropy = [], []
    for start in range(0, logits_NV.shape[0], chunk_tokens):
        z = logits_NV[start:start + chunk_tokens].float() / temperature
        lse = torch.logsumexp(z, dim=-1)
        logp.append(z.gather(1, targets_N[start:start + chunk_tokens, None]).squeeze(1) - lse)
        with torch.no_grad():
            entropy.append(_entropy(z.detach(), lse.detach()))
    if not logp:
        empty = logits_NV.new_zeros(0, dtype=torch.float32)
        return empty, empty
    return torch.cat(logp), torch.cat(entropy)


def head_logprobs(hidden_NH: torch.Tensor, weight_VH: torch.Tensor, targets_N: torch.Tensor, *,
                  temperature: float, chunk_tokens: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Token log-probs through the LM head weight, chunk by chunk, logits never stored."""
    device_type = hidden_NH.device.type
    # under autocast the head runs in the autocast dtype, as the model's own head would
    compute = torch.get_autocast_dtype(device_type) if torch.is_autocast_enabled(device_type) else weight_VH.dtype
    return _HeadLogprob.apply(hidden_NH, weight_VH, targets_N, float(temperature), int(chunk_tokens), compute)


def _entropy(z: torch.Tensor, lse: torch.Tensor) -> torch.Tensor:
    logp = z - lse[:, None]
    return -(logp.exp() * logp).sum(-1)


def _logits(hidden: torch.Tensor, weight: torch.Tensor, temperature: float) -> torch.Tensor:
    z = hidden.to(weight.dtype) @ weight.T
    return z.to(_at_least_fp32(z.dtype)).div_(temperature)


def _at_least_fp32(dtype: torch.dtype) -> torch.dtype:
    """Log-probs in fp32 from bf16/fp16 logits, in fp64 from an fp64 model (exactness tests)."""
    return torch.promote_types(dtype, torch.float32)


class _HeadLogprob(torch.autograd.Function):
    """logp_i = z_i[target_i] - logsumexp(z_i), z = h W^T / temperature, in chunks of tokens.
    Backward recomputes each chunk's logits: d logp_i / d z_i = (onehot(target_i) - softmax(z_i)),
    so grad_h = dz W / T and grad_W = dz^T h / T (accumulated in fp32)."""

    @staticmethod
    def forward(ctx, hidden_NH, weight_VH, targets_N, temperature, chunk_tokens, compute_dtype):
        n = hidden_NH.shape[0]
        logp = hidden_NH.new_empty(n, dtype=_at_least_fp32(compute_dtype))
        entropy, lse = torch.empty_like(logp), torch.empty_like(logp)
        with torch.autocast(hidden_NH.device.type, enabled=False), torch.no_grad():
            weight = weight_VH.to(compute_dtype)
            for start in range(0, n, chunk_tokens):
                end = min(start + chunk_tokens, n)
                z = _logits(hidden_NH[start:end], weight, temperature)
                lse[start:end] = torch.logsumexp(z, dim=-1)
                logp[start:end] = z.gather(1, targets_N[start:end, None]).squeeze(1) - lse[start:end]
                entropy[start:end] = _entropy(z, lse[start:end])
        ctx.save_for_backward(hidden_NH, weight_VH, targets_N, lse)
        ctx.temperature, ctx.chunk_tokens, ctx.compute_dtype = temperature, chunk_tokens, compute_dtype
        ctx.mark_non_differentiable(entropy)
        return logp, entropy

    @staticmethod
    def backward(ctx, grad_logp_N, _grad_entropy):
        hidden_NH, weight_VH, targets_N, lse = ctx.saved_tensors
        want_h, want_w = ctx.needs_input_grad[0], ctx.needs_input_grad[1]
        grad_h = torch.empty_like(hidden_NH) if want_h else None
        grad_w = torch.zeros(weight_VH.shape, dtype=_at_least_fp32(ctx.compute_dtype), device=weight_VH.device) \
            if want_w else None
        temperature = ctx.temperature
        with torch.autocast(hidden_NH.device.type, enabled=False):
            weight = weight_VH.to(ctx.compute_dtype)
            for start in range(0, hidden_NH.shape[0], ctx.chunk_tokens):
                end = min(start + ctx.chunk_tokens, hidden_NH.shape[0])
                g = grad_logp_N[start:end].to(_at_least_fp32(ctx.compute_dtype))
                z = _logits(hidden_NH[start:end], weight, temperature)
                dz = z.sub_(lse[start:end, None]).exp_().mul_(-g[:, None])  # -g * softmax, in z's memory
                dz[torch.arange(end - start, device=dz.device), targets_N[start:end]] += g
                dz = dz.div_(temperature).to(ctx.compute_dtype)
                if want_h:
                    grad_h[start:end] = (dz @ weight).to(hidden_NH.dtype)
                if want_w:
                    grad_w.add_(dz.T @ hidden_NH[start:end].to(ctx.compute_dtype))
        return grad_h, grad_w.to(weight_VH.dtype) if want_w else None, None, None, None, None
