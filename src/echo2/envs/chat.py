"""How a conversation becomes prompt text under a task's config: the tokenizer's chat template
when the config asks for it and the tokenizer has one, else the messages' contents line by line.
Single-turn prompts (echo2.tasks.base.render_prompt) and multi-turn transcripts (transcript.py)
both render through these functions, so a task's prompt is the same text either way. They live
in envs, the lower of the two packages: echo2.tasks imports echo2.envs (its registry holds both
kinds of task), never the other way round."""

from __future__ import annotations

from echo2.config.task import TaskConfigBase


def first_messages(question: str, instruction: str, system_prompt: str) -> list[dict[str, str]]:
    """The conversation a policy starts from: the optional system message, then the question
    (with the instruction on the line after it) as the user's turn."""
    text = f"{question}\n{instruction}" if instruction else question
    system = [{"role": "system", "content": system_prompt}] if system_prompt else []
    return [*system, {"role": "user", "content": text}]


def uses_chat_template(tokenizer, cfg: TaskConfigBase) -> bool:
    return bool(cfg.chat_template and getattr(tokenizer, "chat_template", None))


def render_messages(tokenizer, messages: list[dict[str, str]], cfg: TaskConfigBase) -> str:
    """The tokenizer's chat template applied to `messages` (ending with the assistant's turn to
    answer) when the task config asks for it and the tokenizer has one, else their contents
    line by line. `tokenizer` is any transformers tokenizer (only its chat template is used, no
    torch)."""
    if uses_chat_template(tokenizer, cfg):
        return tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True,
                                             **cfg.chat_template_kwargs)
    return "\n".join(m["content"] for m in messages)
