"""BroadcastConfig: defaults valid, unknown fields and inconsistent timeouts refused clearly."""

from __future__ import annotations

import pytest

from echo2.config.base import validate
from echo2.config.broadcast import BroadcastConfig


def test_defaults_are_pipelined_and_consistent() -> None:
    config = BroadcastConfig()
    assert config.mode == "pipelined"
    assert config.progress_timeout_s > config.stall_timeout_s + config.connect_timeout_s


def test_unknown_field_is_named_with_a_suggestion() -> None:
    with pytest.raises(ValueError, match="did you mean 'chunk_bytes'"):
        validate(BroadcastConfig, {"chunk_byte": 1 << 20})


def test_mode_must_be_known() -> None:
    with pytest.raises(ValueError, match="mode"):
        validate(BroadcastConfig, {"mode": "gossip"})


def test_keepalive_must_fit_twice_in_stall_timeout() -> None:
    with pytest.raises(ValueError, match="keepalive_interval_s"):
        BroadcastConfig(keepalive_interval_s=6.0, stall_timeout_s=10.0)


def test_progress_timeout_must_cover_an_upstream_failover() -> None:
    with pytest.raises(ValueError, match="progress_timeout_s"):
        BroadcastConfig(progress_timeout_s=15.0)


def test_frozen() -> None:
    with pytest.raises(ValueError):
        BroadcastConfig().chunk_bytes = 5  # type: ignore[misc]


def test_announce_wait_must_end_before_children_give_up() -> None:
    with pytest.raises(ValueError, match="announce_wait_s"):
        BroadcastConfig(announce_wait_s=45.0)
