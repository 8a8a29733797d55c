"""PNG plots of the three sweeps (matplotlib, Agg backend, no display needed)."""

from __future__ import annotations

from pathlib import Path

from echo2.report.figures import pyplot, save_figure

TOPOLOGY_LABELS = {
    "one_to_many": "one-to-many (learner sends every copy)",
    "chain": "pipelined chain",
    "tree": "pipelined tree",
    "ideal": "ideal network",
}


def bits_label(bps: float) -> str:
    return f"{bps / 1e9:g} Gbit/s" if bps >= 1e9 else f"{bps / 1e6:g} Mbit/s"


def _duration_label(seconds: float) -> str:
    if seconds >= 3600:
        return f"{seconds / 3600:.1f} h"
    return f"{seconds / 60:.0f} min" if seconds >= 60 else f"{seconds:.0f} s"


def plot_dissemination(data: dict, title: str, path: Path) -> Path:
    """(a) T_dis versus N per topology: markers simulated, dashed lines closed form."""
    plt = pyplot()
    fig, ax = plt.subplots(figsize=(8, 5.5))
    n = data["worker_counts"]
    for topology, series in data["topologies"].items():
        (line,) = ax.plot(n, series["simulated_s"], marker="o", label=TOPOLOGY_LABELS.get(topology, topology))
        ax.plot(n, series["closed_form_s"], linestyle="--", color=line.get_color(), alpha=0.5, linewidth=1)
    ax.set_xscale("log", base=2)
    ax.set_yscale("log")
    ax.set_xlabel("workers receiving the version (N)")
    ax.set_ylabel("publish -> last worker loaded (s)")
    ax.set_title(
        f"{title}: dissemination latency\n{data['snapshot_bytes'] / 1e9:.1f} GB per version, learner uplink "
        f"{bits_label(data['learner_uplink_bps'])}, workers {bits_label(data['worker_bandwidth_bps'])}",
        fontsize=10,
    )
    for seconds in (60, 600, 3600, 36000):
        ax.axhline(seconds, color="grey", linewidth=0.5, alpha=0.4)
        ax.text(n[0], seconds * 1.05, _duration_label(seconds), fontsize=7, color="grey")
    ax.grid(True, which="major", alpha=0.3)
    ax.legend(title="markers: simulated; dashed: closed form", fontsize=8, title_fontsize=8)
    return save_figure(fig, path)


def plot_utilization(grid: dict, title: str, step_time_s: float, path: Path) -> Path:
    """(b) steady learner utilization versus S, one line per worker bandwidth."""
    plt = pyplot()
    fig, ax = plt.subplots(figsize=(8, 5.5))
    s = grid["staleness"]
    for bandwidth, series in grid["by_bandwidth"].items():
        (line,) = ax.plot(s, series["simulated"], marker="o", label=bits_label(float(bandwidth)))
        # the planner's overlap condition is all or nothing: 0 below S_min, its U from S_min on
        ax.plot(
            s,
            series["planner"],
            linestyle=":",
            color=line.get_color(),
            alpha=0.7,
            linewidth=1.2,
            drawstyle="steps-post",
        )
    fleet = ", ".join(f"{count} x {name}" for name, count in grid["fleet"].items())
    ax.set_xlabel("staleness bound S (steps)")
    ax.set_ylabel("learner utilization (steady)")
    ax.set_ylim(0, 1.05)
    ax.set_xticks(s)
    ax.set_title(
        f"{title}: learner utilization vs S and worker bandwidth\nfleet {fleet}; "
        f"T_train {step_time_s:g} s; {grid['steps']} steps per point",
        fontsize=10,
    )
    ax.grid(True, alpha=0.3)
    ax.legend(title="worker bandwidth (dotted: planner)", fontsize=8, title_fontsize=8, loc="lower right")
    return save_figure(fig, path)


def plot_cost(cost: dict, title: str, path: Path) -> Path:
    """(c) total cost and wall time of the same number of steps, echo2 versus centralized."""
    plt = pyplot()
    fig, (ax_cost, ax_time) = plt.subplots(1, 2, figsize=(9, 5))
    echo2, central = cost["echo2"], cost["centralized"]
    names = ["echo2 (simulated)"] + (["centralized"] if central else [])
    ax_cost.bar(names[0], echo2["learner_cost"], color="tab:blue", label="learner")
    ax_cost.bar(
        names[0], echo2["fleet_cost"], bottom=echo2["learner_cost"], color="tab:orange", label="rollout fleet"
    )
    hours = [echo2["wall_s"] / 3600]
    if central:
        ax_cost.bar(names[1], central["total_cost"], color="tab:gray", label="learner GPUs, generate + train")
        hours.append(central["wall_s"] / 3600)
    for i, total in enumerate([echo2["total_cost"]] + ([central["total_cost"]] if central else [])):
        ax_cost.text(i, total, f"${total:,.0f}", ha="center", va="bottom")
    ax_cost.set_ylabel("total cost ($)")
    ax_cost.legend(fontsize=8)
    ax_time.bar(names, hours, color=["tab:blue", "tab:gray"][: len(names)])
    for i, h in enumerate(hours):
        ax_time.text(i, h, f"{h:.1f} h", ha="center", va="bottom")
    ax_time.set_ylabel("wall time (h)")
    saving = cost.get("saving_fraction")
    note = f"; saving {saving:.0%} (paper: 33-36%)" if saving is not None else ""
    fig.suptitle(f"{title}: {cost['steps']} learner steps{note}", fontsize=10)
    return save_figure(fig, path)
