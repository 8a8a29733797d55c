"""Build the embedded tiny model and tokenizer locally (no downloads) and load models the way
users do: `from_pretrained` from a directory or hub id."""
