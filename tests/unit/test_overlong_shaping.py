"""Overlong shaping (DAPO's soft overlong punishment, grpo.overlong_buffer_tokens): the penalty
at its boundaries, the config check that the buffer is below max_new_tokens, shaping before the
uninformative check at the coordinator, and completions cut off at the cap counted."""

from __future__ import annotations

import pytest
from tests.unit.coordinator_helpers import (
    FakeClock,
    answer_ids,
    event_records,
    lease,
    make_state,
    past_slow_start,
    publish,
    register,
)

from echo2.config.run import load_run_config
from echo2.policy.rewards import RewardRules, is_uninformative, overlong_penalty, truncated
from echo2.protocol.messages import RolloutCompletion, RolloutSubmission

L, BUFFER = 10, 4  # the penalty ramps over lengths 7..10


@pytest.mark.parametrize("length, penalty", [(1, 0.0), (L - BUFFER, 0.0), (L - BUFFER + 1, -0.25),
                                             (L - 1, -0.75), (L, -1.0)])
def test_the_penalty_ramps_linearly_over_the_buffer(length, penalty):
    assert overlong_penalty(length, max_new_tokens=L, buffer_tokens=BUFFER, penalty=1.0) == penalty
    assert overlong_penalty(length, max_new_tokens=L, buffer_tokens=BUFFER, penalty=0.5) == penalty / 2


def test_no_buffer_changes_no_reward():
    rules = RewardRules(overlong_buffer_tokens=0)
    assert rules.shaped([1.0, 0.0, 0.5], [1, L, L - 1], max_new_tokens=L) == [1.0, 0.0, 0.5]
    assert all(overlong_penalty(n, max_new_tokens=L, buffer_tokens=0, penalty=1.0) == 0.0 for n in range(L + 1))


def test_shaped_rewards_add_the_penalty_to_each_completion():
    rules = RewardRules(overlong_buffer_tokens=BUFFER, overlong_penalty=2.0)
    assert rules.shaped([1.0, 1.0, 0.0], [L - BUFFER, L - 2, L], max_new_tokens=L) == [1.0, 0.0, -2.0]


@pytest.mark.parametrize("buffer", [8, 9])
def test_a_buffer_not_below_max_new_tokens_is_refused_naming_both_fields(buffer):
    with pytest.raises(ValueError, match=r"grpo.overlong_buffer_tokens=\d+ must be below sampling.max_new_tokens=8"):
        load_run_config(None, [f"grpo.overlong_buffer_tokens={buffer}", "sampling.max_new_tokens=8"])
    cfg = load_run_config(None, ["grpo.overlong_buffer_tokens=7", "sampling.max_new_tokens=8"])
    assert cfg.grpo.overlong_penalty == 1.0


def test_uninformative_means_exactly_equal():
    assert is_uninformative([0.0, 0.0]) and is_uninformative([1.0] * 8)
    assert not is_uninformative([1.0, 1.0 + 1e-12]) and not is_uninformative([])


def test_truncated_is_the_cap_reached_without_an_eos():
    eos = frozenset({3})
    assert truncated([5, 6, 7, 8], max_new_tokens=4, eos_ids=eos)
    assert not truncated([5, 6, 7, 3], max_new_tokens=4, eos_ids=eos)  # stopped at the last token
    assert not truncated([5, 6, 3], max_new_tokens=4, eos_ids=eos)


def test_the_coordinator_shapes_before_the_uninformative_check_and_counts_truncations(tmp_path, tiny_model_dir):
    """Both completions are wrong (task reward 0), one stops after 2 tokens, the other runs into
    the cap of 4 without an EOS: shaped with a 2-token buffer they score 0 and -1, so the group
    is informative and trains (unshaped, it would be dropped)."""
    state = make_state(tmp_path, tiny_model_dir, FakeClock(), max_staleness=1, groups_per_step=1,
                       rewards=RewardRules(overlong_buffer_tokens=2, overlong_penalty=1.0))
    assert state.scorer.eos_ids == {state.scorer.tokenizer.token_to_id("<eos>")}
    register(state, "a")
    past_slow_start(state, "a")
    publish(state, 0)
    task = lease(state, "a", 0).tasks[0]
    short = answer_ids(state, task.lease_id, correct=False)[-2:]  # a digit and the EOS
    long = state.scorer.tokenizer.encode("9999", add_special_tokens=False).ids
    assert len(short) == 2 and len(long) == 4 and long[-1] not in state.scorer.eos_ids
    completions = [RolloutCompletion(token_ids=ids, logprobs=[-0.5] * len(ids)) for ids in (short, long)]
    reply = state.intake.submit(RolloutSubmission(worker_id="a", lease_id=task.lease_id, version=0,
                                           completions=completions, gen_time_s=0.1))
    assert reply.accepted and reply.rewards == [0.0, -1.0]
    assert state.counters.completions_truncated == 1 and state.counters.dropped_uninformative == 0
    batch = state.learner_desk.take_batch(0)
    assert len(batch) == 1 and batch[0].rewards == [0.0, -1.0]
    assert [r["completions_truncated"] for r in event_records(state) if r["kind"] == "batch_assigned"] == [1]
