"""Every string and list a worker can send has a size cap in its schema (so a field added later
without one fails here), and the caps on lists follow the largest sampling settings a run may
have, so an honest worker's largest rollout still parses."""

from __future__ import annotations

import typing

import pytest
from annotated_types import MaxLen
from pydantic import BaseModel, ValidationError

from echo2.config.base import MAX_GROUP_SIZE, MAX_NEW_TOKENS
from echo2.protocol.messages import (
    BadPeerRequest,
    Heartbeat,
    LeaseRequest,
    LeaveRequest,
    RegisterRequest,
    RolloutCompletion,
    RolloutSubmission,
)

WORKER_SENDS = [RegisterRequest, Heartbeat, LeaveRequest, LeaseRequest, RolloutSubmission, BadPeerRequest]


def _uncapped(model: type[BaseModel], prefix: str = "") -> list[str]:
    """Paths of the str and list fields of `model` (and of the models inside it) with no max_length."""
    out = []
    for name, field in model.model_fields.items():
        annotation = field.annotation
        capped = any(isinstance(m, MaxLen) for m in field.metadata)
        if (annotation is str or typing.get_origin(annotation) is list) and not capped:
            out.append(prefix + name)
        for inner in (annotation, *typing.get_args(annotation)):
            if isinstance(inner, type) and issubclass(inner, BaseModel):
                out += _uncapped(inner, f"{prefix}{name}.")
    return out


@pytest.mark.parametrize("message", WORKER_SENDS, ids=lambda m: m.__name__)
def test_every_string_and_list_a_worker_sends_is_capped(message):
    assert _uncapped(message) == []


def test_the_largest_honest_rollout_parses_and_one_more_does_not():
    RolloutCompletion(token_ids=[1] * MAX_NEW_TOKENS, logprobs=[-1.0] * MAX_NEW_TOKENS)
    small = RolloutCompletion(token_ids=[1], logprobs=[-1.0])
    RolloutSubmission(worker_id="w", lease_id="L1", version=0, completions=[small] * MAX_GROUP_SIZE, gen_time_s=1.0)
    with pytest.raises(ValidationError, match="token_ids"):
        RolloutCompletion(token_ids=[1] * (MAX_NEW_TOKENS + 1), logprobs=[-1.0])
    with pytest.raises(ValidationError, match="completions"):
        RolloutSubmission(worker_id="w", lease_id="L1", version=0, completions=[small] * (MAX_GROUP_SIZE + 1),
                          gen_time_s=1.0)


@pytest.mark.parametrize("field", ["rollouts_total", "bytes_relayed_total"])
def test_a_workers_running_totals_are_bounded(field):
    """Shown on the dashboard and /metrics as floats: a huge integer would not convert."""
    Heartbeat(worker_id="w", version=0, **{field: 1 << 53})
    for bad in (-1, (1 << 53) + 1, 10**400):
        with pytest.raises(ValidationError, match=field):
            Heartbeat(worker_id="w", version=0, **{field: bad})
