"""A tiny causal LM of a real transformers architecture (Qwen3) and a character tokenizer built
with `tokenizers`, saved with `save_pretrained` so every role loads them with `from_pretrained`:
the same path a user takes with `Qwen/Qwen3-4B`."""

from __future__ import annotations

from pathlib import Path

from echo2.config.run import ModelConfig

SPECIAL_TOKENS = ["<pad>", "<unk>", "<bos>", "<eos>"]
# printable ASCII: enough for arithmetic and short text tasks, one token per character
CHARACTERS = [chr(code) for code in range(32, 127)]


def build_char_tokenizer():
    """A character-level fast tokenizer: one token per printable ASCII character."""
    from tokenizers import Regex, Tokenizer, decoders, pre_tokenizers
    from tokenizers.models import WordLevel
    from transformers import PreTrainedTokenizerFast

    vocab = {token: index for index, token in enumerate(SPECIAL_TOKENS + CHARACTERS)}
    core = Tokenizer(WordLevel(vocab, unk_token="<unk>"))
    core.pre_tokenizer = pre_tokenizers.Split(Regex("."), behavior="isolated")
    core.decoder = decoders.Fuse()  # characters join without separators
    return PreTrainedTokenizerFast(
        tokenizer_object=core,
        pad_token="<pad>",
        unk_token="<unk>",
        bos_token="<bos>",
        eos_token="<eos>",
        padding_side="left",  # decoder-only generation pads on the left
    )


def build_tiny_model(cfg: ModelConfig, vocab_size: int, seed: int):
    """A freshly initialised Qwen3ForCausalLM of the configured (tiny) size."""
    import torch
    from transformers import Qwen3Config, Qwen3ForCausalLM

    special = {token: index for index, token in enumerate(SPECIAL_TOKENS)}
    config = Qwen3Config(
        vocab_size=vocab_size,
        hidden_size=cfg.hidden_size,
        intermediate_size=cfg.intermediate_size,
        num_hidden_layers=cfg.num_layers,
        num_attention_heads=cfg.num_heads,
        num_key_value_heads=cfg.num_heads,
        head_dim=cfg.hidden_size // cfg.num_heads,
        max_position_embeddings=128,
        tie_word_embeddings=True,
        pad_token_id=special["<pad>"],
        bos_token_id=special["<bos>"],
        eos_token_id=special["<eos>"],
    )
    torch.manual_seed(seed)
    return Qwen3ForCausalLM(config)


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
