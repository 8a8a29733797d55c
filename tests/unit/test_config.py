"""Config loading: example files parse, `--set` overrides apply, errors name field and value."""

from __future__ import annotations

from pathlib import Path

import pytest

from echo2.config import load_run_config, parse_override
from echo2.config.run import RunConfig

CONFIGS = Path(__file__).resolve().parents[2] / "configs"


@pytest.mark.parametrize("path", sorted(CONFIGS.glob("*.toml")), ids=lambda p: p.name)
def test_every_run_config_parses(path):
    cfg = load_run_config(path)
    assert isinstance(cfg, RunConfig) and cfg.train.steps > 0


def test_demo_is_the_documented_default():
    cfg = load_run_config(CONFIGS / "demo.toml")
    assert (cfg.workers.count, cfg.train.max_staleness, cfg.model.source) == (4, 2, "tiny")
    prices = [cfg.workers.worker_config(i).price_per_hour for i in range(4)]
    assert prices == sorted(prices) and prices[0] < prices[-1]  # emulated classes to choose from
    assert cfg.batch_rollouts == 128


def test_overrides_are_toml_values_or_bare_strings():
    assert parse_override("train.steps=7") == (["train", "steps"], 7)
    assert parse_override("grpo.loss=tis") == (["grpo", "loss"], "tis")
    assert parse_override("run_dir=runs/x y") == (["run_dir"], "runs/x y")
    cfg = load_run_config(CONFIGS / "demo.toml", ["train.steps=7", "grpo.loss=tis", "workers.worker.slowdown=2.5"])
    assert (cfg.train.steps, cfg.grpo.loss, cfg.workers.worker.slowdown) == (7, "tis", 2.5)


@pytest.mark.parametrize(
    "override, expected",
    [
        ("train.max_stalenes=3", "train.max_stalenes: unknown field; did you mean 'max_staleness'?"),
        ("train.max_staleness=-1", "train.max_staleness: Input should be greater than or equal to 0 (got -1)"),
        ("grpo.loss=ppo",
         "grpo.loss: Input should be 'tis', 'dapo', 'bnpo', 'grpo', 'dr_grpo', 'gspo', 'cispo' or 'clip' (got 'ppo')"),
        ("coordinator.worker_timeout_s=1.5", "must exceed 2 x heartbeat_interval_s"),
        ("workers.per_worker=[{slowdown = 0.5}]", "workers.per_worker[0]"),
        ("learner.device=gpu", "learner.device: String should match pattern"),
        ("workers.worker.device=cuda:x", "workers.worker.device: String should match pattern"),
        ("learner.precision=fp16", "learner.precision: Input should be 'auto', 'fp32' or 'bf16-mixed'"),
        ("broadcast.wire_dtype=int8", "broadcast.wire_dtype: Input should be"),
        ("grpo.micro_batch_tokens=-5", "grpo.micro_batch_tokens: Input should be greater than or equal to 0"),
    ],
)
def test_errors_name_field_value_and_fix(override, expected):
    base = ["workers.per_worker=[{slowdown = 2.0}, {price_per_hour = 1.0}]"]
    with pytest.raises(ValueError) as err:
        load_run_config(CONFIGS / "demo.toml", base + [override])
    assert expected in str(err.value)


def test_per_worker_overrides_merge_onto_shared_settings():
    cfg = load_run_config(None, ["workers.worker.tasks_per_lease=3", "workers.per_worker=[{slowdown = 4.0}]"])
    first, second = cfg.workers.worker_config(0), cfg.workers.worker_config(1)
    assert (first.worker_id, first.slowdown, first.tasks_per_lease) == ("w0", 4.0, 3)
    assert (second.worker_id, second.slowdown) == ("w1", 1.0)
    # entries past count are unused, so --set workers.count works on any config
    assert load_run_config(None, ["workers.count=1", "workers.per_worker=[{}, {slowdown = 2.0}]"]).workers.count == 1


def test_missing_file_is_a_clear_error(tmp_path):
    with pytest.raises(ValueError, match="does not exist"):
        load_run_config(tmp_path / "nope.toml")


def test_cuda_without_a_cuda_build_is_a_clear_error(monkeypatch):
    import torch

    from echo2.learner.precision import resolve_precision
    from echo2.models.device import resolve_device

    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)  # as on CI, also on a GPU box
    cfg = load_run_config(None, ["learner.device=cuda:0"])
    with pytest.raises(ValueError, match=r"learner.device='cuda:0' but this torch build sees no CUDA GPU"):
        resolve_precision(cfg.learner)
    auto = resolve_precision(load_run_config(None).learner)
    assert (auto.device.type, auto.name) == ("cpu", "fp32")  # auto on a CPU box
    assert resolve_precision(load_run_config(None, ["learner.precision=bf16-mixed"]).learner).name == "bf16-mixed"
    assert resolve_device("cpu", "worker.device").type == "cpu"


def test_the_launchers_worker_arguments_rebuild_the_worker_config():
    """`echo2 run` hands each local worker its settings as --set arguments: nested vLLM
    settings and unset optional ones must come back as they were."""
    from echo2.config.base import apply_overrides, validate
    from echo2.config.worker import WorkerConfig
    from echo2.launch.local import _worker_overrides

    cfg = load_run_config(None, ["workers.worker.engine=vllm", "workers.worker.vllm.max_num_seqs=32",
                                 "workers.worker.vllm.seed=7", "workers.per_worker=[{price_per_hour = 0.5}]"])
    args = _worker_overrides(cfg, 0)
    overrides = [args[i + 1] for i in range(0, len(args), 2)]
    rebuilt = validate(WorkerConfig, apply_overrides({}, overrides))
    assert rebuilt == cfg.workers.worker_config(0)
    assert rebuilt.vllm.max_model_len is None and rebuilt.vllm.seed == 7 and rebuilt.price_per_hour == 0.5
