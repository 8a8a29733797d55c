"""The order training problems are served in: epoch after epoch over a dataset of n rows, each
epoch in its own shuffle drawn from the run seed. Position i of the stream is a pure function of
(seed, n, i), and the coordinator persists how far it has got, so a resumed run continues in
exactly the same order."""

from __future__ import annotations

import random
from functools import lru_cache


@lru_cache(maxsize=4)
def _permutation(seed: int, n: int, epoch: int) -> tuple[int, ...]:
    order = list(range(n))
    random.Random(f"echo2-epoch:{seed}:{n}:{epoch}").shuffle(order)
    return tuple(order)


def row_at(index: int, n: int, seed: int) -> int:
    """The dataset row served at stream position `index`."""
    if n <= 0:
        raise ValueError("the training set is empty")
    epoch, position = divmod(index, n)
    return _permutation(seed, n, epoch)[position]
