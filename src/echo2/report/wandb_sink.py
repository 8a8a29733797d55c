"""The W&B sink: a run under `<run_dir>/wandb/` (offline by default: no account, no network;
`wandb sync <run_dir>/wandb/offline-run-*` uploads it later), scalars against the learner step,
sample completions as a table. Needs the optional extra: `pip install 'echo2[wandb]'`."""

from __future__ import annotations

from echo2.config.run import RunConfig
from echo2.report.sinks import SAMPLE_COLUMNS, Sink

STEP_METRIC = "learner/steps_done"
ELAPSED_METRIC = "time/elapsed_s"


class WandbSink(Sink):
    name = "wandb"

    def __init__(self, cfg: RunConfig) -> None:
        try:
            import wandb
        except ImportError:
            raise ValueError("report.wandb.enabled=true needs the wandb package: pip install 'echo2[wandb]' "
                             "(or set report.wandb.enabled=false)") from None
        self.wandb = wandb
        settings = cfg.report.wandb
        config = cfg.model_dump()
        config["coordinator"]["auth_token"] = ""  # secrets stay out of files and uploads
        cfg.run_path.mkdir(parents=True, exist_ok=True)
        try:
            self.run = wandb.init(
                project=settings.project, entity=settings.entity or None, name=settings.name or cfg.run_path.name,
                tags=list(settings.tags), dir=str(cfg.run_path), mode=settings.mode, config=config,
                # console off: W&B would otherwise capture the launcher's own terminal output
                settings=wandb.Settings(console="off", silent=True),
            )
        except Exception as exc:  # W&B's own error types (no login, no network, a bad entity)
            raise ValueError(f"report.wandb: W&B could not start a run ({exc}). With mode='online' set "
                             "WANDB_API_KEY (or run `wandb login`); report.wandb.mode='offline' needs no account"
                             ) from exc
        # records arrive from several processes, not in step order: a step metric, not wandb's
        # own monotonic step, puts each value where it belongs
        self.run.define_metric(STEP_METRIC)
        self.run.define_metric("*", step_metric=STEP_METRIC)
        self.start_s: float | None = None

    def scalars(self, values: dict[str, float], step: int, time_s: float) -> None:
        self.run.log({**values, **self._axes(step, time_s)})

    def samples(self, rows: list[dict], step: int, time_s: float) -> None:
        table = self.wandb.Table(columns=list(SAMPLE_COLUMNS))
        for row in rows:
            table.add_data(step, *(row[c] for c in SAMPLE_COLUMNS[1:]))
        self.run.log({"samples": table, **self._axes(step, time_s)})

    def close(self) -> None:
        self.run.finish()
        self.wandb.teardown()  # the W&B service process ends with the run, not with our process

    def _axes(self, step: int, time_s: float) -> dict[str, float]:
        """The step, and seconds since the first record (W&B's own clock would say when the
        record was replayed, not when it happened)."""
        if self.start_s is None:
            self.start_s = time_s
        return {STEP_METRIC: step, ELAPSED_METRIC: time_s - self.start_s}
