"""benchmarks/gpu_learning_run.py's own path, on the CPU: the learning run a lent GPU machine
runs (`benchmarks/gpu_smoke.sh`), here with SmolLM2-135M-Instruct for two steps, so the script
that has never met a GPU is known to run and to report what it promises."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.real_model
ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.timeout(600)
def test_the_gpu_learning_run_runs_its_cpu_path(tmp_path, smollm2):
    out = tmp_path / "gpu_learning_run.json"
    done = subprocess.run([sys.executable, "benchmarks/gpu_learning_run.py", "--device", "cpu", "--model",
                           str(smollm2.gguf), "--steps", "2", "--workers", "1", "--new-tokens", "8",
                           "--work-dir", str(tmp_path / "work"), "--out", str(out)],
                          cwd=ROOT, capture_output=True, text=True, timeout=560)
    assert done.returncode == 0, done.stderr[-3000:]
    result = json.loads(out.read_text())
    assert result["device"] == "cpu" and result["steps"] == 2 and len(result["train_s_per_step"]) == 2
    assert result["learner_tokens_per_s"] and result["generation_tokens_per_s"]
    assert result["provenance"]["git_commit"] and 0.0 < result["learner_utilization"] <= 1.0
    assert result["provenance"]["command"].count("gpu_learning_run.py") == 1, result["provenance"]["command"]
