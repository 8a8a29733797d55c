"""The token chooser's K, measured (benchmarks/sampler_audit.py) on the tiny model: its greedy
groups go one at a time through the coordinator's AuditLedger and the learner's Auditor, each
seeded run with its own audit key. A new chooser is checked on every group until proven, so two
flagged groups quarantine it; a chooser that turns after earning standing is checked by chance,
so it gets further in some runs, and is caught in all of them."""

from __future__ import annotations

import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "benchmarks"))

import sampler_audit  # noqa: E402

from echo2.config.audit import AuditConfig  # noqa: E402


def test_the_choosers_k_comes_from_runs_of_the_audit_path(tmp_path):
    out = tmp_path / "sampler_audit_tiny.json"
    sampler_audit.main(["--model", "tiny", "--engines", "hf-fp32", "--groups", "8", "--chosen-groups", "4",
                        "--k-runs", "8", "--out", str(out)])
    result = json.loads(out.read_text())
    assert result["provenance"]["command"].endswith(f"--out {out}")
    [run] = result["runs"]
    assert run["chooser_flagged_share"]["1.0"] == 1.0  # every greedy group falls short somewhere
    k = run["chooser_groups_until_quarantine_measured"]
    audit = AuditConfig()
    assert k["new_chooser"]["k"] == [audit.flags_to_quarantine] * 8
    late = k["late_chooser"]
    assert late["honest_groups_first"] == audit.proven_groups
    assert late["audit_mode_when_it_turned"] == "by_chance" and not late["quarantined_while_honest"]
    assert late["caught"] == 8 and min(late["k"]) >= audit.flags_to_quarantine
    assert max(late["k"]) > audit.flags_to_quarantine  # by chance: some runs' first picks miss it
    assert sum(late["histogram"].values()) == 8
