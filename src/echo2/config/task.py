"""What every task's config has (each task module declares its own schema on top of this one,
see echo2.tasks.registry): how many held-out problems to evaluate and how prompts are rendered."""

from __future__ import annotations

from typing import Any

from pydantic import Field

from echo2.config.base import Frozen


class TaskConfigBase(Frozen):
    eval_size: int = Field(200, ge=1, le=100_000)
    """Held-out problems the learner evaluates (never used as training prompts); fewer if the
    held-out split has fewer."""
    chat_template: bool = True
    """Render prompts with the tokenizer's chat template when it has one (system prompt, then the
    question as the user's turn, then the assistant's turn to answer); false: the raw text."""
    chat_template_kwargs: dict[str, Any] = {}
    """Extra variables for the chat template, e.g. {enable_thinking = false} for Qwen3's."""
    system_prompt: str = Field("", max_length=20_000)
    """Optional system message (prepended as a line of text where there is no chat template)."""
    instruction: str | None = Field(None, max_length=20_000)
    """Appended to every question (e.g. how to format the answer); None: the task's own default."""
