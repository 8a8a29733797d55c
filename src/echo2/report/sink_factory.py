"""The metric sinks a run's `[report]` settings turn on. Apart from sinks.py (the interface the
sinks implement) so that the interface never imports its implementations, whose libraries
(TensorBoard, W&B) load only when a sink is on."""

from __future__ import annotations

from echo2.config.run import RunConfig
from echo2.report.sinks import Sink


def make_sinks(cfg: RunConfig) -> list[Sink]:
    sinks: list[Sink] = []
    if cfg.report.tensorboard:
        from echo2.report.tensorboard_sink import TensorBoardSink

        sinks.append(TensorBoardSink(cfg.run_path / "tensorboard"))
    if cfg.report.wandb.enabled:
        from echo2.report.wandb_sink import WandbSink

        try:
            sinks.append(WandbSink(cfg))
        except ValueError:
            for sink in sinks:  # no writer thread left behind the error
                sink.close()
            raise
    return sinks
