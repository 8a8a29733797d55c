"""End-of-run PNG plots in `<run_dir>/plots/`, drawn from metrics.jsonl alone (as the summary
is): reward and held-out accuracy against learner step and wall time, staleness of trained
groups, learner utilization, publish -> loaded latency per worker, and cost over time. A plot
whose records the run has none of (no cost accounting, no worker in this run dir) is left out."""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterable
from pathlib import Path

from echo2.report.figures import pyplot, save_figure
from echo2.report.summary import eval_records, staleness_mean, step_busy_s, train_steps, utilization

PLOTS_DIR = "plots"
# the kinds the plots read (the rest of the file is streamed past)
PLOT_KINDS = frozenset({"train_step", "checkpoint", "eval", "weights_loaded", "coordinator_stats"})
ROLLING_STEPS = 10


def write_plots(stream: Iterable[dict], out_dir: Path) -> list[Path]:
    """Draw every plot the records allow; returns the files written."""
    start_s, kept = None, []
    for record in stream:
        start_s = record["time"] if start_s is None else min(start_s, record["time"])
        if record["kind"] in PLOT_KINDS:
            kept.append(record)
    steps = train_steps(kept)
    evals = eval_records(kept)
    loaded = [r for r in kept if r["kind"] == "weights_loaded"]
    stats = [r for r in kept if r["kind"] == "coordinator_stats"]
    written = []
    if steps:
        written += [_reward_accuracy(steps, evals, start_s, out_dir / "reward_accuracy.png"),
                    _staleness(steps, out_dir / "staleness.png"),
                    _utilization(steps, step_busy_s(kept), out_dir / "utilization.png")]
    if loaded:
        written.append(_dissemination(loaded, out_dir / "dissemination.png"))
    if stats:
        written.append(_cost(stats, start_s, out_dir / "cost.png"))
    return written


def rolling_mean(values: list[float], window: int = ROLLING_STEPS) -> list[float]:
    """Mean of each value and the up to `window - 1` before it."""
    out, total = [], 0.0
    for i, value in enumerate(values):
        total += value - (values[i - window] if i >= window else 0.0)
        out.append(total / min(i + 1, window))
    return out


def _reward_accuracy(steps: list[dict], evals: list[dict], start_s: float, path: Path) -> Path:
    plt = pyplot()
    fig, (by_step, by_time) = plt.subplots(1, 2, figsize=(11, 4.2), sharey=True)
    reward = [s["reward_mean"] for s in steps]
    # a step is done when its record is written; an evaluation after t steps sits at t
    for ax, x_steps, x_evals in ((by_step, [s["step"] + 1 for s in steps], [e["step"] for e in evals]),
                                 (by_time, [s["time"] - start_s for s in steps], [e["time"] - start_s for e in evals])):
        ax.plot(x_steps, reward, color="tab:blue", alpha=0.3, linewidth=0.8)
        ax.plot(x_steps, rolling_mean(reward), color="tab:blue", label=f"batch reward (mean of {ROLLING_STEPS} steps)")
        if evals:
            ax.plot(x_evals, [e["accuracy"] for e in evals], color="tab:orange", marker="o", label="held-out accuracy")
        ax.grid(True, alpha=0.3)
    by_step.set_xlabel("learner steps done")
    by_time.set_xlabel("wall time since the run started (s)")
    by_step.set_ylabel("reward / accuracy")
    by_step.legend(fontsize=8)
    fig.suptitle("reward and held-out accuracy", fontsize=10)
    return save_figure(fig, path)


def _staleness(steps: list[dict], path: Path) -> Path:
    plt = pyplot()
    fig, ax = plt.subplots(figsize=(8, 4))
    x = [s["step"] + 1 for s in steps]
    mean = [staleness_mean(s["staleness_hist"]) or 0.0 for s in steps]
    ax.plot(x, [s["staleness_max"] for s in steps], color="tab:red", drawstyle="steps-mid", label="max")
    ax.plot(x, mean, color="tab:purple", label="mean")
    ax.set_xlabel("learner steps done")
    ax.set_ylabel("staleness of trained groups (versions)")
    ax.grid(True, alpha=0.3)
    ax.legend(fontsize=8)
    return save_figure(fig, path)


def _utilization(steps: list[dict], busy_s: dict[int, float], path: Path) -> Path:
    plt = pyplot()
    fig, ax = plt.subplots(figsize=(8, 4))
    x = [s["step"] + 1 for s in steps]
    per_step = [utilization([s], busy_s) for s in steps]
    ax.plot(x, per_step, color="tab:green", alpha=0.3, linewidth=0.8)
    ax.plot(x, rolling_mean(per_step), color="tab:green", label=f"mean of {ROLLING_STEPS} steps")
    ax.set_ylim(0, 1.05)
    ax.set_xlabel("learner steps done")
    ax.set_ylabel("learner utilization (busy / (busy + wait))")
    ax.set_title(f"learner utilization: {utilization(steps, busy_s):.1%} over the run", fontsize=10)
    ax.grid(True, alpha=0.3)
    ax.legend(fontsize=8)
    return save_figure(fig, path)


def _dissemination(loaded: list[dict], path: Path) -> Path:
    plt = pyplot()
    fig, ax = plt.subplots(figsize=(8, 4))
    by_worker: dict[str, list[tuple[int, float]]] = defaultdict(list)
    for r in loaded:
        by_worker[r["worker_id"]].append((r["version"], r["publish_to_loaded_s"]))
    for worker, points in sorted(by_worker.items()):
        points.sort()
        ax.plot([v for v, _ in points], [s for _, s in points], marker=".", linewidth=0.8, label=worker)
    ax.set_xlabel("version")
    ax.set_ylabel("publish -> loaded (s)")
    ax.set_title("weight dissemination latency per worker", fontsize=10)
    ax.grid(True, alpha=0.3)
    ax.legend(fontsize=8, ncol=max(1, len(by_worker) // 8))
    return save_figure(fig, path)


def _cost(stats: list[dict], start_s: float, path: Path) -> Path:
    plt = pyplot()
    fig, ax = plt.subplots(figsize=(8, 4))
    stats = sorted(stats, key=lambda r: r["time"])
    t = [r["time"] - start_s for r in stats]
    ax.plot(t, [r["cost_total"] for r in stats], color="tab:blue", label="spent ($)")
    ax.set_xlabel("wall time since the run started (s)")
    ax.set_ylabel("dollars spent")
    rate = ax.twinx()
    rate.plot(t, [r["price_per_hour"] for r in stats], color="tab:gray", drawstyle="steps-post", alpha=0.7,
              label="billing ($/h)")
    rate.set_ylabel("$/h (learner + rented workers)")
    rate.set_ylim(0, 1.15 * max(r["price_per_hour"] for r in stats) or 1.0)  # room above the line
    ax.set_title(f"cost: ${stats[-1]['cost_total']:.4f} spent", fontsize=10)
    ax.grid(True, alpha=0.3)
    fig.legend(fontsize=8, loc="lower right", bbox_to_anchor=(0.88, 0.15))
    return save_figure(fig, path)
