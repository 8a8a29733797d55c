"""Token ids of a multi-turn transcript, rendered with the model's chat template: the first
prompt (system message, the first observation as the user's turn, the assistant's turn to act),
and after each action the environment's segment (close the assistant's turn, the observation as
the next user turn, open the assistant's turn again).

Workers (who play episodes) and the coordinator (who replays them) build a `Codec` from the same
model files with the same classes, so the environment segments a worker sends can be compared
token for token with the ones the coordinator renders. Torch-free: `tokenizers` and
transformers' PreTrainedTokenizerFast only.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

from echo2.config.task import TaskConfigBase
from echo2.envs.chat import first_messages, render_messages, uses_chat_template

# placeholders that no template or observation contains: where the contents go in a rendering
_ASSISTANT, _USER = "\x00echo2-assistant\x00", "\x00echo2-user\x00"


def tokenizer_file(model_source: str) -> Path:
    local = Path(model_source)
    if local.is_dir():
        return local / "tokenizer.json"
    from huggingface_hub import hf_hub_download  # a hub id: same file users' workers load

    return Path(hf_hub_download(model_source, "tokenizer.json"))


def model_vocab_size(model_source: str, tokenizer_size: int) -> int:
    """Model vocabulary (embedding rows) when a config.json is at hand; ids beyond it are invalid."""
    config = Path(model_source) / "config.json"
    if config.is_file():
        return int(json.loads(config.read_text()).get("vocab_size", tokenizer_size))
    return tokenizer_size


def chat_tokenizer(model_source: str):
    """The model's tokenizer as transformers loads it, for its chat template and special tokens
    (this class imports no torch, unlike AutoTokenizer)."""
    from transformers import PreTrainedTokenizerFast

    return PreTrainedTokenizerFast.from_pretrained(model_source)


@dataclass(frozen=True)
class TurnDelimiters:
    """Text the chat template puts around a user turn that follows an assistant turn."""

    before_user: str
    """After the assistant's content, up to the user's (closes the assistant's turn)."""
    after_user: str
    """After the user's content, up to where the assistant writes (the generation prompt)."""


class Codec:
    def __init__(self, tokenizer, chat, cfg: TaskConfigBase) -> None:
        self.tokenizer, self.chat, self.cfg = tokenizer, chat, cfg
        self.eos_id: int = chat.eos_token_id
        self.eos_text: str = chat.eos_token or ""
        self.delimiters = _delimiters(chat, cfg)

    @classmethod
    def from_source(cls, model_source: str, cfg: TaskConfigBase) -> Codec:
        return cls.from_tokenizer(chat_tokenizer(model_source), cfg)

    @classmethod
    def from_tokenizer(cls, tokenizer, cfg: TaskConfigBase) -> Codec:
        """From a loaded transformers fast tokenizer (the learner's, the evaluation's): its
        backend is the same `tokenizers` object workers and the coordinator encode with."""
        return cls(tokenizer.backend_tokenizer, tokenizer, cfg)

    @property
    def vocab_size(self) -> int:
        return self.tokenizer.get_vocab_size(with_added_tokens=True)

    def encode(self, text: str) -> list[int]:
        return self.tokenizer.encode(text, add_special_tokens=False).ids

    def decode_action(self, token_ids: list[int]) -> str:
        """The action an environment is given: the model's tokens as text, special tokens (the
        end of its turn) removed, surrounding whitespace stripped."""
        return self.tokenizer.decode(token_ids, skip_special_tokens=True).strip()

    def prompt_ids(self, observation: str, instruction: str) -> list[int]:
        messages = first_messages(observation, instruction, self.cfg.system_prompt)
        return self.encode(render_messages(self.chat, messages, self.cfg))

    def env_ids(self, observation: str, action_ids: list[int]) -> list[int]:
        """The environment's segment after an action: the template's turn delimiters around the
        observation. When the action ended with the end-of-sequence token and the template's
        closing text begins with that token's text (ChatML's <|im_end|>), it is not repeated."""
        before = self.delimiters.before_user
        if action_ids and action_ids[-1] == self.eos_id and self.eos_text and before.startswith(self.eos_text):
            before = before[len(self.eos_text):]
        return self.encode(before + observation + self.delimiters.after_user)


def _delimiters(chat, cfg: TaskConfigBase) -> TurnDelimiters:
    if not uses_chat_template(chat, cfg):
        # the plain-text rendering, one line per message: the first prompt ends with the
        # observation, and so does every answer (the action follows it directly)
        return TurnDelimiters("\n", "")
    messages = [{"role": "user", "content": "first"}, {"role": "assistant", "content": _ASSISTANT},
                {"role": "user", "content": _USER}]
    text = render_messages(chat, messages, cfg)
    if text.count(_ASSISTANT) != 1 or text.count(_USER) != 1:
        raise ValueError("the tokenizer's chat template does not render an assistant turn followed by a user turn "
                         "verbatim; multi-turn tasks need one that does (or set task.chat_template = false)")
    after_assistant = text.split(_ASSISTANT, 1)[1]
    before_user, after_user = after_assistant.split(_USER, 1)
    return TurnDelimiters(before_user, after_user)
