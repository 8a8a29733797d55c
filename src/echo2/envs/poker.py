"""Heads-up poker against a fixed opponent, with `pokerkit` keeping the rules: Kuhn poker (3
cards, one betting round) or Leduc hold'em (6 cards, a board card, two rounds, fixed-limit bets).

Made for a character-level model: every action is one letter (f fold, c check or call, b bet or
raise), and each observation is one short line with the hand, the board (Leduc), the pot, what it
costs to call, the opponent's last action and the legal letters. The reward is the chips won divided
by the starting stack (in [-1, 1]); an action that is not a legal letter ends the hand at once
with `illegal_reward`.

Cards come from a deck shuffled by the episode's seed and are dealt explicitly (pokerkit's own
shuffle is not seeded); which seat the policy takes is drawn from the seed too.
"""

from __future__ import annotations

import random
from functools import cached_property

from echo2.envs.base import Environment, StepResult
from echo2.envs.opponents import CALL, FOLD, RAISE, Opponent, SeatView

GAMES = ("kuhn", "leduc")
_WORDS = {FOLD: "fold", CALL: "call", RAISE: "bet"}
ACTION_LEGEND = "One letter: f fold, c check/call, b bet/raise."


def _game(name: str):
    import pokerkit

    if name == "kuhn":
        return pokerkit.KuhnPoker, pokerkit.KuhnPokerHand, pokerkit.Deck.KUHN_POKER
    if name == "leduc":
        return pokerkit.LeducHoldem, pokerkit.LeducHoldemHand, pokerkit.Deck.LEDUC_HOLDEM
    raise ValueError(f"task.game: unknown poker game {name!r} (allowed: {list(GAMES)})")


def _automations():
    from pokerkit import Automation as A

    # everything but dealing and the players' decisions: cards are dealt from the seeded deck
    return (A.ANTE_POSTING, A.BET_COLLECTION, A.BLIND_OR_STRADDLE_POSTING, A.CARD_BURNING,
            A.HOLE_CARDS_SHOWING_OR_MUCKING, A.HAND_KILLING, A.CHIPS_PUSHING, A.CHIPS_PULLING)


class PokerEnv(Environment):
    def __init__(self, game: str, opponent: Opponent, illegal_reward: float = -1.0) -> None:
        self.game_name = game
        self.game, self.hand_type, self.deck_type = _game(game)
        self.opponent = opponent
        self.illegal_reward = illegal_reward
        # one hand's state, all of it drawn from the seed by reset (None until then: a step before
        # reset fails at once instead of playing an unseeded hand)
        self.rng: random.Random | None = None
        self.deck: list = []
        self.seat = 0
        self.state = None
        self.last_opponent_action = ""

    @cached_property
    def board_size(self) -> int:
        return 1 if self.game_name == "leduc" else 0

    def reset(self, seed: int) -> str:
        self.rng = random.Random(f"echo2-poker:{self.game_name}:{seed}")
        deck = list(self.deck_type)
        self.rng.shuffle(deck)
        self.deck = deck
        self.seat = self.rng.randrange(2)
        self.state = self.game.create_state(_automations())
        # pokerkit deals from the top of its deck: put the seeded shuffle there
        self.state.deck_cards.clear()
        self.state.deck_cards.extend(self.deck)
        for _ in range(2):
            self.state.deal_hole()
        self.last_opponent_action = ""
        return self._advance() or ""

    def step(self, action: str) -> StepResult:
        letter = action.strip().lower()
        legal = self._legal()
        if letter not in legal:
            return StepResult(observation=f"Illegal action {action[:20]!r}: legal were {''.join(legal)}. Hand over.",
                              reward=self.illegal_reward, done=True, illegal=True)
        self._apply(letter)
        observation = self._advance()
        if observation is not None:
            return StepResult(observation=observation, reward=0.0, done=False)
        payoff = self.state.payoffs[self.seat]
        return StepResult(observation=f"Hand over: you {'won' if payoff >= 0 else 'lost'} {abs(payoff)}.",
                          reward=payoff / self.state.starting_stacks[self.seat], done=True, won=payoff > 0)

    def demo_action(self, rng: random.Random) -> str:
        return rng.choice(self._legal())

    # ---- the table ----
    def _advance(self) -> str | None:
        """Deal boards and let the opponent act until it is the policy's turn (its observation)
        or the hand is over (None)."""
        state = self.state
        while state.status:
            if state.can_deal_board():
                state.deal_board()
            elif state.actor_index == self.seat:
                return self._observation()
            elif state.actor_index is not None:
                letter = self.opponent(self._view(1 - self.seat), self.rng)
                free = letter == CALL and not state.checking_or_calling_amount
                self.last_opponent_action = "check" if free else _WORDS[letter]
                self._apply(letter)
            else:  # pragma: no cover  pokerkit automates every other step we did not leave to it
                raise RuntimeError(f"poker: the hand is stuck (status {state.status}, no actor, no board to deal)")
        return None

    def _apply(self, letter: str) -> None:
        if letter == FOLD:
            self.state.fold()
        elif letter == CALL:
            self.state.check_or_call()
        else:
            self.state.complete_bet_or_raise_to()

    def _legal(self) -> tuple[str, ...]:
        state = self.state
        return tuple(letter for letter, ok in ((FOLD, state.can_fold()), (CALL, state.can_check_or_call()),
                                               (RAISE, state.can_complete_bet_or_raise_to())) if ok)

    def _view(self, seat: int) -> SeatView:
        state = self.state
        hole = tuple(state.hole_cards[seat])
        board = tuple(card for cards in state.board_cards for card in cards)
        unseen = tuple(card for card in self.deck_type if card not in hole and card not in board)
        return SeatView(hole=hole, board=board, unseen=unseen, legal=self._legal(), hand_of=self.hand_type.from_game,
                        board_cards_to_come=self.board_size - len(board))

    def _observation(self) -> str:
        """One short line (every character is a token for the tiny model): "opp bet pot 3 call 1
        legal fc hand K", with "board Q" before the hand in games that have one ("-" until it
        comes). The cards come last, next to where the action is written: a small model finds
        what it must condition on a few positions back more easily than at the start."""
        state, view = self.state, self._view(self.seat)
        board = f" board {''.join(card.rank for card in view.board) or '-'}" if self.board_size else ""
        opponent = self.last_opponent_action or "-"
        return (f"opp {opponent} pot {state.total_pot_amount} call {state.checking_or_calling_amount or 0} legal "
                f"{''.join(view.legal)}{board} hand {''.join(card.rank for card in view.hole)}")
