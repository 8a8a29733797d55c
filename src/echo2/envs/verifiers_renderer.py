"""The renderer echo2 gives verifiers environments: the model's own chat template (verifiers'
`DefaultRenderer`, with its tool and reasoning parsers), plus what the template alone cannot do.

- **Exact ids across turns.** verifiers' train client asks the renderer to extend the previous
  turn (`bridge_to_next_turn`); the default renderer cannot, so the client re-renders the whole
  conversation, and the model's sampled tokens come back decoded and encoded again, which need
  not give the same ids (`test_verifiers_play.py` shows a case). This renderer extends the exact
  previous prompt and completion ids with the template's own text after an assistant turn: the
  new messages and the next generation prompt, as `echo2.envs.transcript.Codec.env_ids` does
  for echo2's own environments. The learner then trains on what the engine sampled.
- **Tool calls in text.** verifiers' Hermes parser ("qwen3") finds `<tool_call>` by token id, so
  it finds nothing with a tokenizer that has no such token (SmolLM2's, the tiny test model's).
  `tool_parser = "hermes-text"` finds the same JSON blocks in the decoded text.

Use it from a verifiers client config as
`CustomRendererConfig(import_path="echo2.envs.verifiers_renderer.ExactRenderer", tool_parser=...)`.
"""

from __future__ import annotations

import json
import re

from renderers.base import ParsedResponse, ParsedToolCall, RenderedTokens, ToolCallParseStatus
from renderers.configs import DefaultRendererConfig
from renderers.default import DefaultRenderer, _decode_tool_call_arguments

HERMES_TEXT = "hermes-text"
_HOLE = "\x00echo2-assistant\x00"  # in no template or message: where the assistant's content goes
_BLOCK = re.compile(r"<tool_call>(.*?)(</tool_call>|$)", re.DOTALL)


class ExactRendererConfig(DefaultRendererConfig):
    """DefaultRendererConfig whose `tool_parser` may also be "hermes-text"."""


class ExactRenderer(DefaultRenderer):
    config_class = ExactRendererConfig

    def __init__(self, tokenizer, config: DefaultRendererConfig | None = None) -> None:
        cfg = config or ExactRendererConfig()
        text_tools = cfg.tool_parser == HERMES_TEXT
        # the text parser is ours: the base class would look "hermes-text" up among its own
        super().__init__(tokenizer, cfg.model_copy(update={"tool_parser": None}) if text_tools else cfg)
        self.config = cfg
        if text_tools:
            self._tool_parser = HermesTextToolParser(tokenizer)

    def bridge_to_next_turn(self, previous_prompt_ids: list[int], previous_completion_ids: list[int],
                            new_messages: list, *, tools: list | None = None) -> RenderedTokens | None:
        """The previous prompt and completion ids unchanged, then the template's text from the end
        of an assistant turn's content to the next generation prompt. When the completion ended
        with the end-of-sequence token and that text begins with the token's text (ChatML's
        <|im_end|>), it is not repeated. None (the client re-renders) when the template does not
        render an assistant's content verbatim."""
        messages = [{"role": "user", "content": "x"}, {"role": "assistant", "content": _HOLE},
                    *_decode_tool_call_arguments([_as_dict(m) for m in new_messages])]
        kwargs = dict(self.config.model_extra or {})
        if tools is not None:
            kwargs["tools"] = tools
        text = self._tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True, **kwargs)
        if text.count(_HOLE) != 1:
            return None
        tail = text.split(_HOLE, 1)[1]
        eos_text, eos_id = self._tokenizer.eos_token or "", self._tokenizer.eos_token_id
        if previous_completion_ids and previous_completion_ids[-1] == eos_id and eos_text and tail.startswith(eos_text):
            tail = tail[len(eos_text):]
        ids = [*previous_prompt_ids, *previous_completion_ids, *self._tokenizer.encode(tail, add_special_tokens=False)]
        return RenderedTokens(token_ids=ids, message_indices=[-1] * len(ids))


class HermesTextToolParser:
    """`<tool_call>{"name": ..., "arguments": {...}}</tool_call>` blocks found in the decoded
    completion. The content is the tokens before the first block."""

    def __init__(self, tokenizer) -> None:
        self._tokenizer = tokenizer

    def extract(self, ids: list[int]) -> tuple[list[int], list[ParsedToolCall]]:
        text = self._tokenizer.decode(ids, skip_special_tokens=False)
        blocks = list(_BLOCK.finditer(text))
        if not blocks:
            return ids, []
        first = self._tokens_before(ids, blocks[0].start())
        return ids[:first], [_parsed(block.group(1).strip(), closed=bool(block.group(2))) for block in blocks]

    def _tokens_before(self, ids: list[int], chars: int) -> int:
        """How many of `ids` decode to text that ends at or before `chars` characters."""
        count = 0
        while count < len(ids) and len(self._tokenizer.decode(ids[:count + 1], skip_special_tokens=False)) <= chars:
            count += 1
        return count


def _parsed(raw: str, *, closed: bool) -> ParsedToolCall:
    if not closed:
        return ParsedToolCall(raw=raw, status=ToolCallParseStatus.UNCLOSED_BLOCK)
    try:
        call = json.loads(raw)
    except json.JSONDecodeError:
        return ParsedToolCall(raw=raw, status=ToolCallParseStatus.INVALID_JSON)
    name = call.get("name") if isinstance(call, dict) else None
    arguments = call.get("arguments", {}) if isinstance(call, dict) else {}
    if not name:
        return ParsedToolCall(raw=raw, arguments=arguments, status=ToolCallParseStatus.MISSING_NAME)
    return ParsedToolCall(raw=raw, name=name, arguments=arguments, status=ToolCallParseStatus.OK)


def _as_dict(message) -> dict:
    return message if isinstance(message, dict) else message.model_dump(exclude_none=True)


__all__ = ["ExactRenderer", "ExactRendererConfig", "HermesTextToolParser", "ParsedResponse"]
