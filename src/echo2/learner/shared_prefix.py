"""A group's completions share their prompt: the learner runs each prompt through the model once
and the completions on top of its key/value cache, instead of the whole prompt once per
completion. With G = 8 completions of 8 tokens after a 45-token chat prompt that is 109 tokens a
group instead of 424.

The gradients are those of the unshared computation: the cache is expanded to the completions
with `index_select`, whose backward sums the completions' gradients into the prompt's keys and
values, exactly as G separate passes over the same prompt would (tests check it in fp64).

Layout of one shared micro-batch:
- pass 1, the prompts without their last token, right-padded: [P, Lp] -> a cache per layer;
- pass 2, per completion: the prompt's last token, then the completion but its last token,
  right-padded: [C, Lc]. Position j of row c predicts completion token j, so every completion
  token is predicted inside pass 2 and the LM head runs on pass 2's hidden states only. Its
  positions continue each prompt's own (prompt length - 1 + j) and its attention mask is the
  prompt's padding mask followed by the completion's, so the padding between them is never seen.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from echo2.models.kv_cache import cache_argument, expand_cache, returned_cache


@dataclass
class SharedMicroBatch:
    prefix_ids_PL: torch.Tensor
    prefix_mask_PL: torch.Tensor
    input_ids_CL: torch.Tensor
    """Per completion: its prompt's last token, then the completion without its last token."""
    attention_mask_CL: torch.Tensor
    positions_CL: torch.Tensor
    prompt_of_C: torch.Tensor
    """Which prefix row each completion row continues."""
    rows_N: torch.Tensor
    cols_N: torch.Tensor
    targets_N: torch.Tensor
    sample_N: torch.Tensor

    @property
    def num_tokens(self) -> int:
        return int(self.targets_N.numel())

    @property
    def processed_tokens(self) -> tuple[int, int]:
        """(prompt, completion) tokens the passes compute, padding excluded."""
        rows = self.input_ids_CL.shape[0]
        completion_part = self.attention_mask_CL[:, self.prefix_ids_PL.shape[1]:]
        return int(self.prefix_mask_PL.sum()) + rows, int(completion_part.sum()) - rows

    def to(self, device: torch.device) -> SharedMicroBatch:
        return SharedMicroBatch(*(getattr(self, f).to(device, non_blocking=True) for f in self.__dataclass_fields__))


def collate_shared(prompts: list[list[int]], completions: list[list[int]], *, prompt_of: list[int],
                   sample_ids: list[int], pad_id: int) -> SharedMicroBatch:
    """`prompts`: the distinct prompts (each at least 2 tokens); completion c continues prompt
    `prompt_of[c]` and is sample `sample_ids[c]` of the step."""
    width_p = max(len(p) - 1 for p in prompts)
    inputs = [[prompts[prompt_of[c]][-1], *completion[:-1]] for c, completion in enumerate(completions)]
    width_c = max(len(r) for r in inputs)
    rows, cols, targets, samples = [], [], [], []
    for row, completion in enumerate(completions):
        rows += [row] * len(completion)
        cols += range(len(completion))
        targets += completion
        samples += [sample_ids[row]] * len(completion)
    prefix_mask = torch.tensor([[1] * (len(p) - 1) + [0] * (width_p - len(p) + 1) for p in prompts])
    completion_mask = torch.tensor([[1] * len(r) + [0] * (width_c - len(r)) for r in inputs])
    starts = torch.tensor([len(prompts[prompt_of[c]]) - 1 for c in range(len(completions))])
    return SharedMicroBatch(
        prefix_ids_PL=torch.tensor([p[:-1] + [pad_id] * (width_p - len(p) + 1) for p in prompts]),
        prefix_mask_PL=prefix_mask,
        input_ids_CL=torch.tensor([r + [pad_id] * (width_c - len(r)) for r in inputs]),
        attention_mask_CL=torch.cat([prefix_mask[prompt_of], completion_mask], dim=1),
        positions_CL=starts[:, None] + torch.arange(width_c)[None, :],
        prompt_of_C=torch.tensor(prompt_of, dtype=torch.long),
        rows_N=torch.tensor(rows, dtype=torch.long),
        cols_N=torch.tensor(cols, dtype=torch.long),
        targets_N=torch.tensor(targets, dtype=torch.long),
        sample_N=torch.tensor(samples, dtype=torch.long),
    )


def shared_hidden_states(model, mb: SharedMicroBatch) -> torch.Tensor:
    """Hidden states [N, H] that predict the micro-batch's completion tokens, prompts computed once."""
    body = model.base_model
    prefix = body(input_ids=mb.prefix_ids_PL, attention_mask=mb.prefix_mask_PL, use_cache=True)
    expanded = expand_cache(returned_cache(prefix), mb.prompt_of_C)
    out = body(input_ids=mb.input_ids_CL, attention_mask=mb.attention_mask_CL, position_ids=mb.positions_CL,
               use_cache=True, **{cache_argument(type(body)): expanded})
    return out.last_hidden_state[mb.rows_N, mb.cols_N]
