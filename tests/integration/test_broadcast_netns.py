"""Shaped broadcasts between real processes in Linux network namespaces (root only): a pipelined
broadcast to 4 workers over 50 Mbit/s tbf links, and the same with a relay process SIGKILLed
mid-transfer. The lab deletes its namespaces and stops its processes by PID, also on failure."""

from __future__ import annotations

import asyncio
import subprocess
from pathlib import Path

import pytest

from echo2.broadcast.lab.experiment import LabSpec, run_lab
from echo2.broadcast.lab.netns import netns_unavailable_reason

pytestmark = [pytest.mark.integration, pytest.mark.system, pytest.mark.netns]
MIB = 1 << 20


@pytest.fixture(scope="module")
def netns() -> None:
    reason = netns_unavailable_reason()
    if reason:
        pytest.skip(f"netns lab unavailable: {reason}")


def _lab_namespaces() -> list[str]:
    listing = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True, check=True).stdout
    return [line.split()[0] for line in listing.splitlines() if line.startswith("e2l")]


def _spec(**changes: object) -> LabSpec:
    base = dict(n_workers=4, total_bytes=8 * MIB, chunk_bytes=256 << 10, origin_up_mbit=50.0,
                worker_up_mbit=50.0, worker_down_mbit=50.0)
    return LabSpec(**{**base, **changes})  # type: ignore[arg-type]


def test_shaped_pipelined_broadcast_reaches_four_workers(netns: None, tmp_path: Path) -> None:
    before = _lab_namespaces()
    result = asyncio.run(run_lab(_spec(), tmp_path))
    assert result["all_correct"] and result["failed"] == {} and result["verified"]["count"] == 4
    assert result["max_depth"] == 4  # equal links: a chain
    total = result["total_bytes"]
    assert result["origin_bytes_sent"] == total  # the learner sent one copy for four workers
    assert sorted(result["relayed_bytes"].values()) == [0, total, total, total]
    # the links really are shaped (nobody beats M / b) and the chain really pipelines
    assert result["measured_s"] >= 0.9 * result["ideal_s"]
    assert result["measured_s"] < 2 * result["predicted_s"] + 1.0
    assert _lab_namespaces() == before  # cleaned up


def test_relay_process_killed_mid_transfer(netns: None, tmp_path: Path) -> None:
    result = asyncio.run(run_lab(_spec(kill=("w1", 0.6)), tmp_path))
    assert set(result["failed"]) == {"w1"}
    assert result["all_correct"] and result["verified"]["count"] == 3
    total = result["total_bytes"]
    w2 = result["bytes_by_source"]["w2"]
    assert set(w2) == {"w1", "w0"} and sum(w2.values()) == total  # resumed at w0, not from zero
    assert 0 < result["resumed_at_chunks"]["w2"][0] < total // (256 << 10)
    assert result["bytes_by_source"]["w3"] == {"w2": total}  # w3 kept its live parent
