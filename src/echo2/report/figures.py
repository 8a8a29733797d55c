"""matplotlib set up for files only (Agg backend: headless machines, tests), and saving a figure
the same way everywhere (the simulator's sweeps and a run's end-of-run plots)."""

from __future__ import annotations

from pathlib import Path


def pyplot():
    import matplotlib

    matplotlib.use("Agg")  # files only: works on headless machines and in tests
    import matplotlib.pyplot as plt

    return plt


def save_figure(fig, path: Path) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    fig.clf()
    pyplot().close(fig)
    return path
