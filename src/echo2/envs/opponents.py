"""Fixed opponent policies for the poker environment: a random player, a calling station and a
simple equity bot. Each sees only what a player at the table sees (its own card, the board, the
legal actions) and draws any randomness from the episode's generator, so a replay from the same
seed and the same actions makes the same decisions."""

from __future__ import annotations

import itertools
import random
from collections.abc import Callable, Sequence
from dataclasses import dataclass

FOLD, CALL, RAISE = "f", "c", "b"
"""Action letters: fold; check or call; bet or raise."""


@dataclass(frozen=True)
class SeatView:
    hole: tuple
    """The player's own cards (pokerkit Card objects)."""
    board: tuple
    unseen: tuple
    """Cards neither on the board nor in this player's hand (the opponent's card is among them)."""
    legal: tuple[str, ...]
    hand_of: Callable
    """pokerkit's Hand.from_game of the game: the best hand of (hole cards, board cards)."""
    board_cards_to_come: int


Opponent = Callable[[SeatView, random.Random], str]


def random_player(view: SeatView, rng: random.Random) -> str:
    return rng.choice(view.legal)


def calling_station(view: SeatView, rng: random.Random) -> str:
    """Never folds, never bets: checks or calls every time."""
    return CALL


# the equity bot raises with at least this share of the pot won against a random hand, checks or
# calls above the lower bound, and otherwise checks or folds (K, Q, J in Kuhn poker: raise, call, fold)
RAISE_EQUITY, CALL_EQUITY = 0.65, 0.4


def equity_bot(view: SeatView, rng: random.Random) -> str:
    equity = hand_equity(view)
    if equity >= RAISE_EQUITY and RAISE in view.legal:
        return RAISE
    if equity >= CALL_EQUITY or FOLD not in view.legal:
        return CALL
    return FOLD


def hand_equity(view: SeatView) -> float:
    """Share of the pot this hand wins at showdown against a uniformly random opponent card,
    over every board still to come (exact enumeration: the games here have 3 to 6 cards)."""
    won, total = 0.0, 0
    for opponent_card in view.unseen:
        rest = [c for c in view.unseen if c != opponent_card]
        for board_rest in itertools.combinations(rest, view.board_cards_to_come):
            board = (*view.board, *board_rest)
            mine, theirs = view.hand_of(view.hole, board), view.hand_of((opponent_card,), board)
            won += 1.0 if mine > theirs else 0.5 if mine == theirs else 0.0
            total += 1
    return won / total if total else 0.5


OPPONENTS: dict[str, Opponent] = {
    "random": random_player,
    "calling_station": calling_station,
    "equity": equity_bot,
}


def opponent(name: str) -> Opponent:
    if name not in OPPONENTS:
        raise ValueError(f"unknown poker opponent {name!r} (allowed: {sorted(OPPONENTS)})")
    return OPPONENTS[name]


def names() -> Sequence[str]:
    return tuple(OPPONENTS)
