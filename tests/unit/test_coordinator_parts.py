"""The coordinator's parts and typed records: each part built from its own config section,
one event type per metrics kind, group states as an enum through the store, and replies that
are typed messages."""

from __future__ import annotations

import json

import pytest
from tests.unit.coordinator_helpers import (
    FakeClock,
    lease,
    make_state,
    publish,
    quick_config,
    register,
    submission,
)

from echo2.config.run import CoordinatorConfig, RunConfig
from echo2.coordinator.records import events as ev
from echo2.coordinator.records.store import GroupState, Store
from echo2.coordinator.scoring.scorer import Scorer
from echo2.coordinator.state import CoordinatorState
from echo2.protocol.learner_api import BatchRequest
from echo2.tasks import make_task


def test_a_new_coordinator_setting_is_one_config_field_and_one_use(tmp_path, tiny_model_dir):
    """Each part is built from its own config section and keeps it, not a copy: a setting added
    to [coordinator] (the one field, here in a subclass) reaches the part that reads it (the one
    use) with nothing in between to change: no settings copy, no resolve step, no constructor
    argument."""

    class WithNewSetting(CoordinatorConfig):
        rejoin_grace_s: float = 7.5

    cfg = quick_config(tiny_model_dir)
    cfg = cfg.model_copy(update={"coordinator": WithNewSetting(**cfg.coordinator.model_dump())})
    state = CoordinatorState(cfg, Store(tmp_path / "coordinator.db"),
                             Scorer(make_task(cfg.task, seed=0), str(tiny_model_dir)), clock=FakeClock())
    assert state.registry.cfg.rejoin_grace_s == 7.5
    # and every part reads the run's own sections
    assert state.registry.cfg is cfg.coordinator and state.controller.cfg is cfg.activation
    assert state.versions.dissemination.config is cfg.broadcast and state.worker_desk.cfg is cfg
    auto = RunConfig().evaluation  # where = "auto": on workers unless the task plays episodes
    assert auto.on_workers(multi_turn=False) and not auto.on_workers(multi_turn=True)


def test_the_data_plane_applies_the_lease_cap_default(tmp_path, tiny_model_dir):
    state = make_state(tmp_path, tiny_model_dir, FakeClock(), groups_per_step=3, max_leases_per_worker=0)
    assert state.groups.plane.max_leases_per_worker == 3


def test_every_event_kind_has_one_type_and_a_json_record():
    kinds = ev.event_kinds()
    subclasses = [cls for cls in _all_subclasses(ev.Event)]
    assert len(kinds) == len(subclasses), "two event types share a kind"
    assert {"worker_registered", "batch_assigned", "version_published", "eval", "coordinator_stats"} <= set(kinds)
    record = ev.GroupsDropped(reason="stale", step=3, prompt_indices=[1, 2]).record()
    assert (list(record) == ["kind", "reason", "step", "prompt_indices", "straddling"]
            and record["kind"] == "groups_dropped")
    json.dumps(record)


def test_a_run_of_the_state_machine_emits_only_typed_events(tmp_path, tiny_model_dir):
    state = make_state(tmp_path, tiny_model_dir, FakeClock(), groups_per_step=1)
    register(state, "a")
    publish(state, 0)
    task = lease(state, "a", 0).tasks[0]
    state.intake.submit(submission(state, "a", task.lease_id, 0))
    assert state.learner_desk.take_batch(0)
    events = state.take_events()
    assert events and all(isinstance(e, ev.Event) for e in events) and state.events == []
    assert [e.kind for e in events] == ["worker_registered", "version_published", "batch_assigned"]


def test_group_states_go_through_the_store_as_the_enum(tmp_path, tiny_model_dir):
    state = make_state(tmp_path, tiny_model_dir, FakeClock(), groups_per_step=1)
    register(state, "a")
    publish(state, 0)
    task = lease(state, "a", 0).tasks[0]
    state.intake.submit(submission(state, "a", task.lease_id, 0))
    (buffered,) = state.store.groups_in_state(GroupState.BUFFERED)
    assert buffered.lease_id == task.lease_id  # one id: lease, task and group
    state.learner_desk.take_batch(0)
    assert state.store.has_groups(GroupState.TRAINED, 0) and not state.store.groups_in_state(GroupState.BUFFERED)
    state.store.close()
    rows = Store(tmp_path / "coordinator.db").db.execute("SELECT DISTINCT state FROM groups").fetchall()
    assert rows == [("trained",)]  # stored as the plain names older stores hold


def test_a_batch_request_is_validated_like_any_message():
    assert BatchRequest(step=2, wait_s=1.0).durable_step is None
    with pytest.raises(ValueError):
        BatchRequest(step=-1)
    with pytest.raises(ValueError):
        BatchRequest(step=0, stale_field=1)


def _all_subclasses(cls):
    for sub in cls.__subclasses__():
        yield sub
        yield from _all_subclasses(sub)


def test_one_id_names_a_lease_its_group_and_their_records(tmp_path, tiny_model_dir):
    """The lease id a worker is handed is the id its submission names, the stored group's id and
    the id the learner's batch carries: one name, `lease_id`, on every message."""
    from echo2.protocol.learner_api import GroupAudit, RejectBatchRequest
    from echo2.protocol.messages import RolloutSubmission, Task, TrainGroup

    for message in (Task, RolloutSubmission, TrainGroup, GroupAudit):
        assert "lease_id" in message.model_fields and not {"task_id", "group_id"} & set(message.model_fields)
    assert "requeue_lease_ids" in RejectBatchRequest.model_fields
    state = make_state(tmp_path, tiny_model_dir, FakeClock(), groups_per_step=1)
    publish(state, 0)
    register(state, "w0")
    leased = lease(state, "w0", 0).tasks[0]
    state.intake.submit(submission(state, "w0", leased.lease_id, 0))
    assert [g.lease_id for g in state.learner_desk.take_batch(0)] == [leased.lease_id]


def test_a_store_from_before_protocol_6_is_refused_with_its_fix(tmp_path):
    import sqlite3

    old = sqlite3.connect(tmp_path / "coordinator.db")
    old.execute("CREATE TABLE groups (group_id TEXT PRIMARY KEY, seq INTEGER NOT NULL, state TEXT NOT NULL, "
                "step INTEGER, payload TEXT NOT NULL)")
    old.commit()
    old.close()
    with pytest.raises(ValueError, match="before protocol 6.*start a new run_dir"):
        Store(tmp_path / "coordinator.db")
