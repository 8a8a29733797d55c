"""Trained groups leave the coordinator's store once the learner's checkpoint covers their step,
and resume still works: a learner killed after its checkpoint replays the later steps on the
same batches, after a coordinator restart too; asking for a deleted step is a clear error."""

from __future__ import annotations

import sqlite3

import pytest
from tests.unit.coordinator_helpers import (
    FakeClock,
    event_records,
    lease,
    make_state,
    past_slow_start,
    publish,
    register,
    submission,
)
from tests.unit.learner_fakes import FakeIO, addition_batch, learner_config

from echo2.coordinator.records.errors import RequestError
from echo2.coordinator.records.store import Store
from echo2.coordinator.state import CoordinatorState
from echo2.learner.train import Learner
from echo2.models.loading import load_tokenizer


def _one_step(state: CoordinatorState, step: int) -> list[dict]:
    """Workers fill step `step`'s batch, the learner takes it and publishes the next version."""
    for task in lease(state, "a", step, max_tasks=state.cfg.grpo.prompts_per_step).tasks:
        assert state.intake.submit(submission(state, "a", task.lease_id, step)).accepted
    batch = state.learner_desk.take_batch(step)
    assert batch
    publish(state, step + 1)
    return batch


def _stored_steps(state: CoordinatorState) -> dict[str, list]:
    db = state.store.db
    return {"groups": sorted(r[0] for r in db.execute("SELECT step FROM groups WHERE state != 'buffered'")),
            "batches": [r[0] for r in db.execute("SELECT step FROM batches ORDER BY step")]}


def test_checkpointed_steps_are_deleted_and_the_rest_replays_exactly(tmp_path, tiny_model_dir):
    clock = FakeClock()
    state = make_state(tmp_path, tiny_model_dir, clock)
    register(state, "a")
    past_slow_start(state, "a")
    publish(state, 0)
    batches = [_one_step(state, step) for step in range(6)]
    state.learner_desk.checkpointed(4, step=6)  # the learner checkpointed step 4 and asks for step 6
    assert _stored_steps(state) == {"groups": [4, 4, 5, 5], "batches": [4, 5]}
    assert event_records(state)[-1] == {"kind": "groups_compacted", "durable_step": 4, "groups_deleted": 8,
                                "store_bytes": state.store.size_bytes()}
    # a learner killed before its next checkpoint resumes at step 4: the same data again
    assert state.learner_desk.take_batch(4) == batches[4] and state.learner_desk.take_batch(5) == batches[5]
    with pytest.raises(RequestError, match="step 3's batch was deleted once the learner checkpointed step 4") as err:
        state.learner_desk.take_batch(3)
    assert err.value.status == 409
    state.learner_desk.checkpointed(2, step=4)  # an older checkpoint reported late changes nothing
    assert state.groups.durable_step == 4
    with pytest.raises(RequestError, match="durable_step=7 is ahead") as err:
        state.learner_desk.checkpointed(7, step=7)  # batches were assigned up to step 5 only
    assert err.value.status == 422

    state.store.close()  # the coordinator restarts
    revived = make_state(tmp_path, tiny_model_dir, clock)
    assert revived.groups.durable_step == 4 and revived.groups.steps_taken == 6
    assert revived.learner_desk.take_batch(5) == batches[5]
    register(revived, "a")
    past_slow_start(revived, "a")
    assert [g.version for g in _one_step(revived, 6)] == [6, 6]  # and the run goes on
    assert revived.counters.trained == 14


def test_rejected_and_stale_groups_of_checkpointed_steps_go_too(tmp_path, tiny_model_dir):
    state = make_state(tmp_path, tiny_model_dir, FakeClock(), max_staleness=0, groups_per_step=1)
    register(state, "a")
    publish(state, 0)

    def submit(version: int) -> None:
        task = lease(state, "a", version).tasks[0]
        assert state.intake.submit(submission(state, "a", task.lease_id, version)).accepted

    submit(0)
    assert state.learner_desk.take_batch(0) and state.learner_desk.reject_batch(0, "loss is nan") == 1
    submit(0)
    assert state.learner_desk.take_batch(0)  # step 0 again, on a fresh group
    publish(state, 1)
    submit(1)
    state.groups.buffer.append(state.store.batch(0)[0].model_copy(update={"lease_id": "straggler"}))  # stale at step 1
    state.store.add_group(state.groups.buffer[-1], state.groups.seq)
    assert state.learner_desk.take_batch(1) and state.counters.dropped_stale == 1
    states = dict(state.store.db.execute("SELECT state, COUNT(*) FROM groups GROUP BY state"))
    assert states == {"trained": 2, "rejected": 1, "dropped": 1}
    state.learner_desk.checkpointed(2, step=2)
    assert state.store.db.execute("SELECT COUNT(*) FROM groups").fetchone()[0] == 0


def test_a_store_from_before_compaction_is_converted_and_keeps_its_data(tmp_path, tiny_model_dir):
    path = tmp_path / "coordinator.db"
    old = sqlite3.connect(path)  # the default: auto_vacuum off, freed pages never returned
    old.execute("CREATE TABLE meta (key TEXT PRIMARY KEY, value TEXT NOT NULL)")
    old.execute("""INSERT INTO meta VALUES ('cursor', '7')""")
    old.commit()
    old.close()
    store = Store(path)
    assert store.db.execute("PRAGMA auto_vacuum").fetchone()[0] == 2  # incremental
    assert store.get_meta("cursor") == 7


def test_the_learner_reports_its_newest_checkpoint_with_each_batch_request(tmp_path, tiny_model_dir):
    tokenizer = load_tokenizer(str(tiny_model_dir))
    cfg = learner_config(tmp_path / "run", tiny_model_dir, train={"steps": 3, "checkpoint_every": 2})
    io = FakeIO([addition_batch(tokenizer, seed) for seed in range(3)])
    Learner(cfg, "", learner_token="", io=io).train()
    assert io.asked == [0, 1, 2] and io.durable == [None, None, 2]
    more = learner_config(tmp_path / "run", tiny_model_dir, train={"steps": 4, "checkpoint_every": 2})
    resumed = FakeIO([addition_batch(tokenizer, 3)])
    Learner(more, "", learner_token="", io=resumed).train()  # resumes from the final checkpoint, step 3
    assert resumed.asked == [3] and resumed.durable == [3]
