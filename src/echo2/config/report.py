"""What a run reports beyond metrics.jsonl (`[report]`): the TensorBoard and W&B sinks fed from
its records, the sample completions the learner logs, and the PNG plots written at the end."""

from __future__ import annotations

from typing import Literal

from pydantic import Field

from echo2.config.base import Frozen


class WandbConfig(Frozen):
    """A Weights & Biases run mirroring the metrics (needs the optional extra: `pip install
    'echo2[wandb]'`). Written under `<run_dir>/wandb/`."""

    enabled: bool = False
    """Off by default: W&B is an optional dependency and an account is needed to upload."""
    mode: Literal["offline", "online"] = "offline"
    """"offline": everything stays in `<run_dir>/wandb/offline-run-*` (no account, no network);
    upload later with `wandb sync DIR`. "online": streams to the W&B server ($WANDB_API_KEY)."""
    project: str = Field("echo2", min_length=1, max_length=128)
    """W&B project the run is filed under."""
    entity: str = Field("", max_length=128)
    """Team or user the run belongs to; empty: the account's default."""
    name: str = Field("", max_length=128)
    """Display name of the run; empty: the run dir's name."""
    tags: tuple[str, ...] = ()
    """W&B tags of the run, for filtering runs in the W&B interface."""


class ReportConfig(Frozen):
    tensorboard: bool = True
    """Mirror the metrics as TensorBoard scalars (and sample completions as text) in
    `<run_dir>/tensorboard/`: `tensorboard --logdir <run_dir>/tensorboard`. Cheap: a few
    hundred bytes per learner step. Rewritten from metrics.jsonl when a run resumes."""
    wandb: WandbConfig = WandbConfig()
    samples_every_steps: int = Field(10, ge=0)
    """The learner logs a few of its batch's completions (prompt, completion, reward) every this
    many steps as a `samples` record, which the sinks show as text / a table. 0: never."""
    samples_per_step: int = Field(4, ge=1, le=64)
    """Completions per `samples` record: one from each of the batch's first groups."""
    sample_chars: int = Field(400, ge=16, le=10_000)
    """Longer prompts and completions are cut to this many characters (the end of a prompt and
    the start of a completion are kept), so a record stays small whatever the task."""
    plots: bool = True
    """At the end of `echo2 run`, write PNG plots (reward and accuracy against step and wall
    time, staleness, learner utilization, dissemination latency per worker, cost) to
    `<run_dir>/plots/` and list them in the summary; `echo2 report --run-dir DIR` redraws them."""
