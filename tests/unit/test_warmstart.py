"""The supervised warm start stops once its accuracy check reaches warmstart.stop_at_accuracy,
checked every check_every steps, and runs all its steps without one."""

from __future__ import annotations

from echo2.config.run import WarmStartConfig
from echo2.config.task import AdditionConfig
from echo2.learner.warmstart import warm_start
from echo2.models.loading import load_model, load_tokenizer
from echo2.tasks import make_task


def test_warm_start_stops_at_the_accuracy_asked_for(tiny_model_dir):
    tokenizer, task = load_tokenizer(str(tiny_model_dir)), make_task(AdditionConfig(digits=1), seed=0)
    readings = iter([0.1, 0.3, 0.6, 0.9])
    asked = []

    def accuracy() -> float:
        asked.append(1)
        return next(readings)

    cfg = WarmStartConfig(steps=40, batch_size=4, stop_at_accuracy=0.5, check_every=5)
    loss, steps = warm_start(load_model(str(tiny_model_dir)), tokenizer, task, cfg, seed=0, accuracy=accuracy)
    assert steps == 15 and len(asked) == 3 and loss == loss  # stopped at the third check (0.6 >= 0.5)
    _, steps = warm_start(load_model(str(tiny_model_dir)), tokenizer, task,
                          WarmStartConfig(steps=12, batch_size=4, check_every=5), seed=0, accuracy=accuracy)
    assert steps == 12 and len(asked) == 3  # no target: never asked, every step taken


def test_a_cached_base_is_keyed_by_the_tasks_reference_format(tmp_path, monkeypatch):
    """A warm-started base imitates the task's reference completions: when a task's code changes
    them (its config's reference_format), a base cached from the old ones is not reused."""
    from echo2.config.run import RunConfig
    from echo2.models.prepare import cache_path

    cfg = RunConfig(run_dir=str(tmp_path / "run"), cache_dir=str(tmp_path / "cache"),
                    task=AdditionConfig(pad_tokens=16))
    before = cache_path(cfg)
    assert cache_path(cfg) == before  # the same config, the same key
    monkeypatch.setattr(AdditionConfig, "reference_format", AdditionConfig.reference_format + 1)
    assert cache_path(cfg) != before
