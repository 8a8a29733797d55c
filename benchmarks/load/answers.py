"""The answers a simulated worker gives: the run's tokenizer (its tokenizer.json, read with
`tokenizers`, no torch) turns an addition prompt's token ids back into text, and the right sum,
or random digits, into token ids the coordinator's vocabulary check accepts."""

from __future__ import annotations

import re
from pathlib import Path


class AnswerBook:
    """Token ids of the right answer to an addition prompt, and of random digits (the
    tokenizer's own ids, so completions pass the coordinator's vocabulary check)."""

    def __init__(self, tokenizer_json: Path) -> None:
        from tokenizers import Tokenizer

        self.tokenizer = Tokenizer.from_file(str(tokenizer_json))
        self.digits = self.tokenizer.encode("0123456789", add_special_tokens=False).ids
        self.cache: dict[tuple[int, ...], list[int]] = {}

    def answer(self, prompt_ids: list[int]) -> list[int]:
        key = tuple(prompt_ids)
        if key not in self.cache:
            found = re.search(r"(\d+)\s*\+\s*(\d+)\s*=\s*$", self.tokenizer.decode(prompt_ids))
            text = str(int(found[1]) + int(found[2])) if found else ""
            self.cache[key] = self.tokenizer.encode(text, add_special_tokens=False).ids if text else []
        return self.cache[key]
