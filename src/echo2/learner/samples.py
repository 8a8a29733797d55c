"""A few of a batch's completions as text, for the `samples` metrics record the sinks show
(TensorBoard text, a W&B table): bounded in count and length whatever the task or the worker
sent, so the record stays small."""

from __future__ import annotations

from echo2.config.report import ReportConfig
from echo2.protocol.messages import TrainGroup


def clip_text(text: str, max_chars: int, keep: str) -> str:
    """`text` cut to `max_chars` characters, marking the cut with "…"; `keep` "start" or "end"
    says which part stays (a prompt's question is at its end, a completion's answer at its start)."""
    if len(text) <= max_chars:
        return text
    return text[: max_chars - 1] + "…" if keep == "start" else "…" + text[len(text) - max_chars + 1:]


def sample_rows(groups: list[TrainGroup], decode, cfg: ReportConfig) -> list[dict]:
    """One completion (the first) of each of the first `samples_per_step` groups, decoded with
    `decode(token_ids) -> str`: prompt, completion, reward, and who generated it at which version."""
    rows = []
    for group in groups[: cfg.samples_per_step]:
        if not group.completions:
            continue
        rows.append({
            "prompt": clip_text(decode(group.prompt_ids), cfg.sample_chars, keep="end"),
            "completion": clip_text(decode(group.completions[0].token_ids), cfg.sample_chars, keep="start"),
            "reward": float(group.rewards[0]),
            "worker_id": group.worker_id,
            "version": group.version,
        })
    return rows
