"""The environment interface and the games: deterministic from the seed, the prompts show what
a player sees, illegal actions end the episode with the penalty, rewards are chips won
normalised; the fixed opponents play as they are described."""

from __future__ import annotations

import random

import pytest

from echo2.config.run import load_run_config
from echo2.envs.guess import GuessNumberEnv
from echo2.envs.opponents import OPPONENTS, SeatView, calling_station, equity_bot, hand_equity
from echo2.envs.poker import PokerEnv
from echo2.tasks import make_task


def play_out(env, seed: int, policy) -> tuple[list[str], float, object]:
    observations, total = [env.reset(seed)], 0.0
    rng = random.Random(seed)
    while True:
        result = env.step(policy(observations[-1], env, rng))
        total += result.reward
        observations.append(result.observation)
        if result.done:
            return observations, total, result


def random_legal(obs, env, rng):
    return env.demo_action(rng)


@pytest.mark.parametrize("game", ["kuhn", "leduc"])
def test_poker_is_a_function_of_the_seed_and_the_actions(game):
    env = PokerEnv(game, OPPONENTS["random"])
    first = [play_out(env, seed, random_legal)[:2] for seed in range(30)]
    again = [play_out(env, seed, random_legal)[:2] for seed in range(30)]
    assert first == again
    assert len({obs[0] for obs, _ in first}) > 3  # different seeds, different deals and seats


def test_poker_prompts_show_hand_board_pot_and_legal_actions():
    env = PokerEnv("leduc", OPPONENTS["calling_station"])
    obs = env.reset(7)
    assert obs[:-1] == "opp - pot 2 call 0 legal cb board - hand " and obs[-1] in "JQK", obs
    after = env.step("b").observation  # the calling station calls: the board card comes
    assert after[:-8] == "opp call pot 6 call 0 legal cb board " and after[-1] == obs[-1], after
    assert after[-8] in "JQK" and after[-7:-1] == " hand ", after
    kuhn = PokerEnv("kuhn", OPPONENTS["random"])
    first = [kuhn.reset(seed) for seed in range(20)]
    assert {o[:-1] for o in first} == {"opp - pot 2 call 0 legal cb hand ", "opp bet pot 3 call 1 legal fc hand ",
                                       "opp check pot 2 call 0 legal cb hand "}  # no board in Kuhn poker


def test_kuhn_rewards_are_chips_won_over_the_stack():
    env = PokerEnv("kuhn", OPPONENTS["calling_station"])
    for seed in range(40):
        obs, total, last = play_out(env, seed, lambda o, e, r: "b" if "b" in o.split("legal ")[1] else "c")
        card = obs[0][-1]
        # betting and being called: showdown for 2 chips of a stack of 2
        assert total == {"K": 1.0, "J": -1.0}[card] if card != "Q" else total in (1.0, -1.0)
        assert last.won == (total > 0)


@pytest.mark.parametrize("bad", ["x", "fold please", "", "bb", "f"])
def test_an_illegal_action_ends_the_hand_with_the_penalty(bad):
    env = PokerEnv("kuhn", OPPONENTS["random"], illegal_reward=-0.75)
    for seed in range(20):
        obs = env.reset(seed)
        if "f" not in obs.split("legal ")[1]:  # not facing a bet: folding is not legal either
            result = env.step(bad)
            assert result.done and result.illegal and result.reward == -0.75 and not result.won
            assert "legal were cb" in result.observation
            return
    raise AssertionError("no seed put the policy first to act")


def test_the_fixed_opponents():
    from pokerkit import Deck, KuhnPokerHand

    jack, queen, king = list(Deck.KUHN_POKER)

    def view(card, legal):
        return SeatView(hole=(card,), board=(), unseen=tuple(c for c in (jack, queen, king) if c != card),
                        legal=legal, hand_of=KuhnPokerHand.from_game, board_cards_to_come=0)

    assert [hand_equity(view(c, ("c", "b"))) for c in (jack, queen, king)] == [0.0, 0.5, 1.0]
    assert equity_bot(view(king, ("c", "b")), random.Random(0)) == "b"
    assert equity_bot(view(queen, ("f", "c")), random.Random(0)) == "c"
    assert equity_bot(view(jack, ("f", "c")), random.Random(0)) == "f"
    assert equity_bot(view(jack, ("c", "b")), random.Random(0)) == "c"  # checks rather than folds for free
    assert calling_station(view(jack, ("f", "c")), random.Random(0)) == "c"
    picks = {OPPONENTS["random"](view(queen, ("f", "c", "b")), random.Random(s)) for s in range(30)}
    assert picks == {"f", "c", "b"}


def test_guess_the_number_by_halving():
    env = GuessNumberEnv(high=16, max_guesses=5)

    def halving(obs, e, rng):
        return str((e.low_bound + e.high_bound) // 2)

    results = [play_out(env, seed, halving) for seed in range(50)]
    assert all(last.won and total == 1.0 for _, total, last in results)
    assert len({env.reset(s) and env.secret for s in range(50)}) > 8
    env.reset(0)
    bad = env.step("seventeen")
    assert bad.done and bad.illegal and bad.reward == -1.0
    env.reset(0)
    assert env.step("17").illegal  # out of range


def test_running_out_of_guesses_earns_nothing():
    env = GuessNumberEnv(high=1000, max_guesses=2)
    env.reset(3)
    wrong = "1" if env.secret != 1 else "2"
    assert not env.step(wrong).done
    last = env.step(wrong)
    assert last.done and last.reward == 0.0 and not last.won and not last.illegal


def test_env_tasks_are_configured_like_any_task():
    cfg = load_run_config(None, ["task.name=poker", "task.game=leduc", "task.opponent=equity"])
    task = make_task(cfg.task, cfg.seed)
    task.check()
    assert task.kind == "episode" and task.eval_opponents() == ["random", "calling_station", "equity"]
    assert task.train_seed(3) == make_task(cfg.task, cfg.seed).train_seed(3)  # every process agrees
    assert set(task.eval_seeds(500)).isdisjoint(task.train_seed(i) for i in range(5000))
    with pytest.raises(ValueError, match="task.opponent"):
        load_run_config(None, ["task.name=poker", "task.opponent=shark"])
    guess = make_task(load_run_config(None, ["task.name=guess_number", "task.high=50"]).task, 0)
    assert guess.eval_opponents() == ["-"] and "50" in guess.make_env().reset(1)
