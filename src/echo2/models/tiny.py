"""A tiny causal LM of a real transformers architecture (Qwen3) and a character tokenizer built
with `tokenizers`, saved with `save_pretrained` so every role loads them with `from_pretrained`:
the same path a user takes with `Qwen/Qwen3-4B`."""

from __future__ import annotations

from pathlib import Path

from echo2.config.run import ModelConfig

BUILD_VERSION = 2
"""Bumped whenever the tiny model or tokenizer changes, so cached warm starts are rebuilt
(2: the newline and the chat tokens, a chat template, 512 positions)."""
SPECIAL_TOKENS = ["<pad>", "<unk>", "<bos>", "<eos>"]
# printable ASCII: enough for arithmetic and short text tasks, one token per character
CHARACTERS = [chr(code) for code in range(32, 127)]
# after the characters, so the ids of the tokens above stay as they were
EXTRA_CHARACTERS = ["\n"]
CHAT_TOKENS = ["<|system|>", "<|user|>", "<|assistant|>", "<|end|>"]
# A minimal chat template (the shape of ChatML), so prompts of chat-template tasks go through the
# same apply_chat_template path a real model's tokenizer takes.
CHAT_TEMPLATE = (
    "{% for message in messages %}<|{{ message['role'] }}|>{{ message['content'] }}<|end|>\n{% endfor %}"
    "{% if add_generation_prompt %}<|assistant|>{% endif %}"
)
MAX_POSITIONS = 512
BASE_VOCAB = len(SPECIAL_TOKENS) + len(CHARACTERS)


def build_char_tokenizer():
    """A character-level fast tokenizer: one token per printable ASCII character."""
    from tokenizers import Regex, Tokenizer, decoders, pre_tokenizers
    from tokenizers.models import WordLevel
    from transformers import PreTrainedTokenizerFast

    vocab = {token: index for index, token in enumerate(SPECIAL_TOKENS + CHARACTERS + EXTRA_CHARACTERS)}
    core = Tokenizer(WordLevel(vocab, unk_token="<unk>"))
    # "." and the newline: every character is a token (Oniguruma's "." excludes the newline)
    core.pre_tokenizer = pre_tokenizers.Split(Regex("[\\s\\S]"), behavior="isolated")
    core.decoder = decoders.Fuse()  # characters join without separators
    tokenizer = PreTrainedTokenizerFast(
        tokenizer_object=core,
        pad_token="<pad>",
        unk_token="<unk>",
        bos_token="<bos>",
        eos_token="<eos>",
        additional_special_tokens=CHAT_TOKENS,
        padding_side="left",  # decoder-only generation pads on the left
    )
    tokenizer.chat_template = CHAT_TEMPLATE
    return tokenizer


def build_tiny_model(cfg: ModelConfig, vocab_size: int, seed: int):
    """A freshly initialised Qwen3ForCausalLM of the configured (tiny) size."""
    import torch
    from transformers import Qwen3Config, Qwen3ForCausalLM

    special = {token: index for index, token in enumerate(SPECIAL_TOKENS)}
    config = Qwen3Config(
        vocab_size=min(vocab_size, BASE_VOCAB),
        hidden_size=cfg.hidden_size,
        intermediate_size=cfg.intermediate_size,
        num_hidden_layers=cfg.num_layers,
        num_attention_heads=cfg.num_heads,
        num_key_value_heads=cfg.num_heads,
        head_dim=cfg.hidden_size // cfg.num_heads,
        max_position_embeddings=MAX_POSITIONS,
        tie_word_embeddings=True,
        pad_token_id=special["<pad>"],
        bos_token_id=special["<bos>"],
        eos_token_id=special["<eos>"],
    )
    torch.manual_seed(seed)
    # Rows for the tokens added after the first 99 (the newline, the chat tokens) are appended
    # after initialising a 99-row model, so every other weight is drawn exactly as before they
    # existed: what the warm start reaches depends a lot on the initial draw (from rarely to
    # almost always right, seed to seed), and the demo's seed is chosen for a base that is
    # sometimes right and has much to learn.
    model = Qwen3ForCausalLM(config)
    if vocab_size > BASE_VOCAB:
        model.resize_token_embeddings(vocab_size, mean_resizing=False)
    return model


def save_tiny(cfg: ModelConfig, out_dir: Path, seed: int) -> None:
    """Write an untrained tiny model + tokenizer to out_dir with `save_pretrained`."""
    from echo2.models.loading import quiet_transformers

    quiet_transformers()
    tokenizer = build_char_tokenizer()
    model = build_tiny_model(cfg, vocab_size=len(tokenizer), seed=seed)
    model.generation_config.pad_token_id = tokenizer.pad_token_id
    out_dir.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(out_dir)
    tokenizer.save_pretrained(out_dir)
