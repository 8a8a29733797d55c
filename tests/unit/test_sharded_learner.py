"""The learner sharded over 2 ranks (FSDP2, gloo, torchrun) trains as the plain learner does on
the same batches, and its checkpoints move between 1 and 2 ranks both ways.

Tolerance: both learners compute in fp32 and differ only in the order gradients are summed
(reduce-scatter over ranks against accumulation in one process), about 1e-7 relative per
gradient. AdamW divides each update by the root of its second moment, so such differences can
grow where a gradient is near zero, but an update never exceeds lr (1e-2 here) per step: two
steps move a weight at most 0.02, and 2e-5 absolute is a thousandth of that (measured here: the
tiny model's sums come out bit-identical, difference 0.0). The first version (before any step)
and every version republished from a checkpoint must match bit for bit."""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from tests.unit.learner_fakes import StepIO
from tests.unit.sharded_learner_child import sharded_config, write_outputs

from echo2.learner.checkpoint_reader import load_model_weights
from echo2.learner.train import Learner
from echo2.models.loading import load_model, load_tokenizer
from echo2.models.weights import payload_tensors, unique_tensors

ROOT = Path(__file__).resolve().parents[2]
ATOL = 2e-5
# two ranks importing torch and transformers on a 2-core box take ~15 s; a minute means a hang
RUN_TIMEOUT_S = 180


def _two_ranks(model_dir: Path, *jobs: tuple[Path, int, Path]) -> None:
    """The 2-rank learner on each (run_dir, steps, out) in turn, in one torchrun."""
    env = {**os.environ, "PYTHONPATH": f"{ROOT / 'src'}:{ROOT}", "OMP_NUM_THREADS": "1"}
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2",
           "-m", "tests.unit.sharded_learner_child", str(model_dir), *(str(arg) for job in jobs for arg in job)]
    # its own process group, killed whole on a timeout: killing torchrun alone left its ranks behind
    proc = subprocess.Popen(cmd, cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            start_new_session=True)
    try:
        stdout, stderr = proc.communicate(timeout=RUN_TIMEOUT_S)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        stdout, stderr = proc.communicate()
        raise AssertionError(f"2 ranks still running after {RUN_TIMEOUT_S} s:\n"
                             f"{stdout[-3000:]}{stderr[-5000:]}") from None
    assert proc.returncode == 0, stdout[-3000:] + stderr[-5000:]


def _one_rank(run_dir: Path, model_dir: Path, steps: int, out: Path) -> None:
    io = StepIO(load_tokenizer(str(model_dir)))
    Learner(sharded_config(run_dir, model_dir, steps), "", learner_token="", io=io).train()
    write_outputs(io, out)


def _version(out: Path, version: int) -> dict[str, torch.Tensor]:
    return {k: v.clone() for k, v in payload_tensors((out / f"v{version}.safetensors").read_bytes()).items()}


def _max_diff(a: dict[str, torch.Tensor], b: dict[str, torch.Tensor]) -> float:
    assert a.keys() == b.keys()
    return max(float((a[k] - b[k]).abs().max()) for k in a)


@pytest.fixture(scope="module")
def runs(tmp_path_factory, tiny_model_dir):
    """A plain and a 2-rank learner, 2 steps each on the same batches; and, in the same torchrun
    as the 2-rank one (each torchrun costs ~15 s of start-up), the 2-rank learner resumed from a
    copy of the plain one's step-2 checkpoint for a third step (`one-to-two`, which
    test_checkpoints_resume_from_two_ranks_on_one_and_from_one_on_two checks)."""
    base = tmp_path_factory.mktemp("sharded")
    _one_rank(base / "one", tiny_model_dir, 2, base / "one-out")
    shutil.copytree(base / "one", base / "one-to-two")
    _two_ranks(tiny_model_dir, (base / "two", 2, base / "two-out"), (base / "one-to-two", 3, base / "one-to-two-out"))
    return base


def test_two_ranks_match_one_rank_on_the_same_batches(runs):
    one, two = runs / "one-out", runs / "two-out"
    assert sorted(p.name for p in two.glob("v*.safetensors")) == ["v0.safetensors", "v1.safetensors", "v2.safetensors"]
    assert (two / "v0.safetensors").read_bytes() == (one / "v0.safetensors").read_bytes()
    for version in (1, 2):
        moved = _max_diff(_version(one, version), _version(one, 0))
        assert moved > 1e-3  # the steps really changed the weights
        assert _max_diff(_version(two, version), _version(one, version)) < ATOL
    # the audit recomputed the stale groups of step 1 on rank 0 and measured what the plain learner did
    audits_one, audits_two = (json.loads((out / "audits.json").read_text())["audits"] for out in (one, two))
    assert [step for step, _ in audits_two] == [step for step, _ in audits_one] == [0, 1]
    for (_, a), (_, b) in zip(audits_one, audits_two, strict=True):
        assert [v["lease_id"] for v in a] == [v["lease_id"] for v in b]
        assert [v["recomputed"] for v in a] == [v["recomputed"] for v in b]
        for x, y in zip(a, b, strict=True):
            assert x["mean_abs_logprob_diff"] == pytest.approx(y["mean_abs_logprob_diff"], abs=1e-4)
    assert any(v["recomputed"] for v in audits_two[1][1])
    newest = sorted((runs / "two" / "checkpoints").glob("step_*"))[-1]
    meta = json.loads((newest / "meta.json").read_text())
    assert meta["step"] == 2 and meta["format"] == "dcp" and meta["ranks"] == 2


def test_a_sharded_checkpoint_loads_into_a_plain_model(runs, tiny_model_dir):
    """What `echo2 export` and `echo2 eval` do with a checkpoint of several ranks."""
    model = load_model(str(tiny_model_dir))
    load_model_weights(runs / "two" / "checkpoints" / "step_0000002", model)
    assert _max_diff(unique_tensors(model), _version(runs / "two-out", 2)) == 0.0


def test_checkpoints_resume_from_two_ranks_on_one_and_from_one_on_two(runs, tiny_model_dir):
    # the reference: the plain learner resumed from its own step-2 checkpoint for a third step
    shutil.copytree(runs / "one", runs / "ref")
    _one_rank(runs / "ref", tiny_model_dir, 3, runs / "ref-out")
    # 2 ranks -> 1 rank, and 1 rank -> 2 ranks, each from the step-2 checkpoint of the other
    shutil.copytree(runs / "two", runs / "two-to-one")
    _one_rank(runs / "two-to-one", tiny_model_dir, 3, runs / "two-to-one-out")
    # (1 rank -> 2 ranks ran in the `runs` fixture's torchrun, from its own copy of `one`)
    for resumed, source in (("two-to-one-out", "two-out"), ("one-to-two-out", "one-out")):
        out = runs / resumed
        assert json.loads((out / "audits.json").read_text())["asked"] == [2]  # resumed at step 2
        # the version republished on resume is exactly the one the other learner published
        assert (out / "v2.safetensors").read_bytes() == (runs / source / "v2.safetensors").read_bytes()
        # and the third step, which needs the restored AdamW moments, lands where the reference's did
        assert _max_diff(_version(out, 3), _version(runs / "ref-out", 3)) < ATOL
