"""A worker returning tokens it did not sample joins a real `echo2 run`: the rollout audit
catches it within a few groups, the coordinator quarantines it and the worker exits saying why,
none of its failed groups is trained, and the run completes with every step trained once. The
liar chooses its tokens (greedy) and reports their true log-probs under the version it holds:
only the seeded sampler's check can see it (the random-token lie, which the log-prob comparison
catches, is in tests/unit/test_rollout_audit.py and benchmarks/chaos.py)."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest
from tests.conftest import small_run_config
from tests.integration.runs import TOKEN, coordinator_url, processes, records, wait_for, write_config
from tests.reliability.accounting import accounting, assert_sound

pytestmark = [pytest.mark.integration, pytest.mark.system]  # a minute-long run (docs/development.md)
REPO = Path(__file__).resolve().parents[2]


def test_a_lying_worker_is_quarantined_and_none_of_its_failed_groups_is_trained(tmp_path):
    # every group audited (and every group dynamic sampling would drop sent to the audit): the test
    # is about what follows a failure, not how often one is sampled
    # dynamic sampling on (the default): the chooser's G greedy completions score alike, and only
    # the audit's sample of the dropped groups (audit.uninformative_fraction) can catch it
    cfg = small_run_config(tmp_path / "liar", train={"steps": 30, "max_staleness": 1, "eval_every": 30},
                           audit={"recompute_fraction": 1.0, "uninformative_fraction": 1.0},
                           grpo={"prompts_per_step": 4, "drop_uninformative_groups": True})
    config = write_config(tmp_path / "liar.toml", cfg)
    metrics = cfg.run_path / "metrics.jsonl"
    with processes() as start:
        run = start(["run", "--config", str(config)], tmp_path / "run.log")
        url = wait_for(lambda: coordinator_url(cfg.run_path), 120, "the coordinator's address", alive=run)
        log = open(tmp_path / "liar.log", "wb")
        liar = subprocess.Popen(
            [sys.executable, "-m", "tests.reliability.lying_worker", "--coordinator", url, "--metrics", str(metrics),
             "--set", "worker_id=liar"], cwd=REPO, stdout=log, stderr=subprocess.STDOUT, start_new_session=True,
            env={**os.environ, "ECHO2_AUTH_TOKEN": TOKEN, "ECHO2_LIE": "choose"})
        log.close()
        try:
            assert liar.wait(timeout=240) == 1  # cut off by the coordinator: non-zero, with the reason
            assert run.wait(timeout=240) == 0, (tmp_path / "run.log").read_text()[-3000:]
        finally:
            if liar.poll() is None:
                os.killpg(liar.pid, signal.SIGKILL)
                liar.wait(timeout=10)
    said = (tmp_path / "liar.log").read_text()
    assert "quarantined: rollout audit" in said and "not the seeded sampler's choice" in said

    quarantined = records(cfg.run_path, "worker_quarantined")
    assert [q["worker_id"] for q in quarantined] == ["liar"]
    audits = records(cfg.run_path, "audit")
    failed = sum(a["by_worker"].get("liar", {}).get("failed", 0) for a in audits)
    assert failed >= cfg.audit.flags_to_quarantine
    # no honest group failed: the tolerance leaves honest engine noise far below it
    assert all(a["by_worker"][w]["failed"] == 0 for a in audits for w in a["by_worker"] if w != "liar")
    trained = {r["step"]: r for r in records(cfg.run_path, "train_step")}
    assert sorted(trained) == list(range(30))
    trained_ids = [g for r in trained.values() for g in r["lease_ids"]]
    assert len(trained_ids) == len(set(trained_ids))
    failed_ids = {g for a in audits for g in a["failed_lease_ids"]}
    assert len(failed_ids) == failed and not failed_ids & set(trained_ids)  # never trained
    prompts = [p for r in trained.values() for p in r["prompt_indices"]]
    assert len(prompts) == len(set(prompts))  # nothing trained twice, redone prompts included
    # the liar's stale groups that the audit did not sample could be trained; no batch assigned
    # after its quarantine holds any of its groups
    cut_at = quarantined[0]["time"]
    assigned = {r["step"]: r["time"] for r in records(cfg.run_path, "batch_assigned")}
    assert not any(r["groups_by_worker"].get("liar") for step, r in trained.items() if assigned[step] > cut_at)
    assert_sound(accounting(cfg.run_path, max_staleness=1), 30)  # the liar's prompts were redone
    summary = json.loads((cfg.run_path / "summary.json").read_text())
    assert summary["audit"]["quarantined"].keys() == {"liar"}
    assert summary["audit"]["groups_failed"] == failed
