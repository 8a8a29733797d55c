"""Each named objective (grpo.loss) learning on this machine, side by side in one run of this
script: held-out accuracy before and after, and wall time, on the embedded task (the tiny model,
configs/demo.toml: 2-digit addition) and on the real-model task (SmolLM2-135M-Instruct,
configs/smollm2_addition.toml: one-digit addition), 2 seeds each. Then the learner time that
dropping uninformative groups saves (grpo.drop_uninformative_groups on against off, `tis`), and
their share.

Each run is a fresh `echo2 run` process (benchmarks/real_model_learning.py's runner and analysis:
accuracy from the coordinator's evaluation leases, Wilson intervals, the paired gain, time to
target). One run at a time: the machine has 2 cores.

    .venv/bin/python benchmarks/objectives.py                                 # everything
    .venv/bin/python benchmarks/objectives.py --tasks embedded --seeds 0
    .venv/bin/python benchmarks/objectives.py --parts drop
    .venv/bin/python benchmarks/objectives.py --reanalyse        # the results again, from the run dirs
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "benchmarks"))
sys.path.insert(0, str(ROOT / "src"))

import real_model_learning as rml  # noqa: E402
from load.provenance import provenance, same_code  # noqa: E402

from echo2.learner.objectives import OBJECTIVES  # noqa: E402

CONFIGS = {
    "embedded": ROOT / "configs" / "demo.toml",
    "real": ROOT / "configs" / "smollm2_addition.toml",
}
EMBEDDED = ["warmstart.steps=500", "train.steps=100", "train.eval_every=20", "train.checkpoint_every=1000",
            "activation.enabled=false", "workers.count=2"]
"""The demo shortened: a weaker warm start (500 steps: about 0.56 held-out, so there is room to
learn), 100 steps, evaluated every 20 versions, two workers, no activation (the objectives'
comparison, not the fleet's)."""
REAL = ["train.steps=10", "train.eval_every=5"]
"""The real-model config with 10 steps, not 20, evaluated every 5 versions (0, 5, 10): 18 runs of
a 22-30 s learner step on 2 cores. In real_model_learning.json `tis` reached 0.95 by version 6-12
(and 0.91 at version 5, 0.955 at 10 in a 15-step `grpo` run here), and the 200-problem evaluation
of every version cost the workers more CPU than generation did (350 s against 190 s a run);
before and after is what this comparison reads."""
TARGETS = {"embedded": 0.65, "real": 0.95}
MEASURES = ("src/echo2", "configs", "benchmarks/objectives.py", "benchmarks/real_model_learning.py")
"""The code its results measure (benchmarks/check.py lists a result as stale when it changed)."""


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--tasks", default="embedded,real")
    parser.add_argument("--losses", default=",".join(OBJECTIVES))
    parser.add_argument("--seeds", default="0,1")
    parser.add_argument("--parts", default="objectives,drop", help="objectives and/or drop")
    parser.add_argument("--work-dir", default=str(ROOT / "runs" / "bench-objectives"))
    parser.add_argument("--out", default=str(ROOT / "benchmarks/results/objectives.json"))
    parser.add_argument("--reanalyse", action="store_true", help="rebuild the results from the runs under --work-dir")
    return parser.parse_args(argv)


def run(task: str, loss: str, seed: int, args: argparse.Namespace, extra: list[str], label: str = "") -> dict:
    """One `echo2 run` through real_model_learning's runner (its CONFIGS pointed at ours)."""
    rml.CONFIGS[task] = CONFIGS[task]
    rml.TARGET = TARGETS[task]
    data = rml.write_addition_data(Path(args.work_dir) / "addition_1digit.jsonl")
    overrides = [*(EMBEDDED if task == "embedded" else REAL), *extra]
    inner = argparse.Namespace(steps=0, overrides=overrides, work_dir=str(Path(args.work_dir) / (label or "runs")))
    staleness = 2 if task == "embedded" else 1  # each config's own S
    result = rml.run_one("addition" if task == "real" else task, staleness, loss, seed, inner, data)
    summary = json.loads((Path(result["run_dir"]) / "summary.json").read_text())
    return {**result, "task": task, "label": label, "overrides": overrides, "steps_trained": summary["steps"],
            "uninformative": {k: summary.get(k) for k in ("groups_dropped_uninformative", "uninformative_share",
                                                          "completions_truncated")},
            "learner": _learner_work(Path(result["run_dir"]))}


def _learner_work(run_dir: Path) -> dict:
    """What the learner's compute bought: groups trained, the uninformative ones among them (zero
    advantage: they teach nothing), and learner seconds per informative group."""
    steps = [r for r in rml.read_metrics(run_dir / "metrics.jsonl") if r["kind"] == "train_step"]
    groups = sum(len(r["lease_ids"]) for r in steps)
    alike = sum(r.get("uninformative_groups", 0) for r in steps)
    train_s = sum(r["train_s"] for r in steps)
    return {"groups_trained": groups, "uninformative_trained": alike, "train_s": round(train_s, 2),
            "train_s_per_informative_group": round(train_s / max(1, groups - alike), 4)}


def headline(r: dict) -> dict:
    """What the results file keeps of a run (and what per_objective and drop_comparison read)."""
    if "time" not in r:  # already a headline, read back from the file
        return r
    keys = ("task", "loss", "seed", "label", "accuracy_before", "accuracy_after", "accuracy_after_ci95",
            "paired_gain", "time_to_target_s", "wall_s", "learner_utilization", "steps_trained", "uninformative",
            "learner", "accuracy_vs_time")
    return {**{k: r[k] for k in keys}, "learner_train_s": r["time"]["learner_train_s"]}


def per_objective(runs: list[dict]) -> list[dict]:
    out = []
    for task in sorted({r["task"] for r in runs}):
        for loss in OBJECTIVES:
            group = [r for r in runs if r["task"] == task and r["loss"] == loss]
            if not group:
                continue
            out.append({"task": task, "loss": loss, "seeds": [r["seed"] for r in group],
                        "accuracy_before_mean": round(statistics.fmean(r["accuracy_before"] for r in group), 4),
                        "accuracy_after_mean": round(statistics.fmean(r["accuracy_after"] for r in group), 4),
                        "accuracy_after_by_seed": [r["accuracy_after"] for r in group],
                        "wall_s_mean": round(statistics.fmean(r["wall_s"] for r in group), 1),
                        "time_to_target_s_by_seed": [r["time_to_target_s"] for r in group]})
    return out


def drop_comparison(runs: list[dict]) -> list[dict]:
    """Per task and seed: learner compute per step with and without dropping, and the share."""
    out = []
    for task in sorted({r["task"] for r in runs}):
        for seed in sorted({r["seed"] for r in runs if r["task"] == task}):
            by = {r["label"]: r for r in runs if r["task"] == task and r["seed"] == seed and r["loss"] == "tis"}
            if "" in by and "drop-on" not in by:  # dropping is the default: the objectives' `tis` run is drop-on
                by["drop-on"] = by[""]
            by.pop("", None)
            if {"drop-on", "drop-off"} - set(by):
                continue
            on, off = by["drop-on"], by["drop-off"]
            per_group = {k: r["learner"]["train_s_per_informative_group"] for k, r in by.items()}
            out.append({"task": task, "seed": seed, "uninformative_dropped": on["uninformative"],
                        "uninformative_trained_share_off": round(off["learner"]["uninformative_trained"]
                                                                 / max(1, off["learner"]["groups_trained"]), 4),
                        "learner": {k: r["learner"] for k, r in by.items()},
                        "learner_time_saved_per_informative_group": round(1 - per_group["drop-on"]
                                                                          / max(1e-9, per_group["drop-off"]), 4),
                        "accuracy_after": {"drop-on": on["accuracy_after"], "drop-off": off["accuracy_after"]},
                        "wall_s": {"drop-on": on["wall_s"], "drop-off": off["wall_s"]}})
    return out


def kept_runs(out: Path, made: dict) -> list[dict]:
    """The runs already in `out`, if they measured the code `made` describes (`same_code`)."""
    earlier = json.loads(out.read_text()) if out.is_file() else {}
    return earlier.get("runs", []) if same_code(earlier.get("provenance"), made) else []


def save(out: Path, runs: list[dict], argv: list[str]) -> None:
    """Write `runs` with the runs already in `out` (the same task, objective, seed and label
    replaced) where they measured this same code (`same_code`), so parts of the benchmark run
    at different times at one commit add up in one file; runs of other code are not merged."""
    key = lambda r: (r["task"], r["loss"], r["seed"], r["label"])  # noqa: E731
    made = provenance(ROOT, argv)
    kept = kept_runs(out, made)
    mine = {key(r) for r in runs}
    runs = [r for r in kept if key(r) not in mine] + [headline(r) for r in runs]
    objective_runs = [r for r in runs if not r["label"]]
    result = {"benchmark": "objectives", "provenance": made,
              "configs": {t: str(p.relative_to(ROOT)) for t, p in CONFIGS.items()},
              "embedded_overrides": EMBEDDED, "real_overrides": REAL,
              "targets": TARGETS, "objectives": per_objective(objective_runs),
              "drop_uninformative": drop_comparison(runs),
              "runs": runs}
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(result, indent=2))


def reanalyse(work_dir: Path) -> list[dict]:
    """Every finished run under `work_dir` analysed again from its files (runs/<name> for the
    objectives, drop-on/<name> and drop-off/<name> for the dropping comparison)."""
    runs = []
    for label_dir in sorted(p for p in work_dir.iterdir() if p.is_dir()):
        label = "" if label_dir.name == "runs" else label_dir.name
        for run_dir in sorted(p for p in label_dir.iterdir() if (p / "summary.json").is_file()):
            name, seed = run_dir.name.rsplit("-seed", 1)
            task_name, staleness, loss = name.split("-", 2)
            task = "real" if task_name == "addition" else task_name
            rml.TARGET = TARGETS[task]
            launched = json.loads((run_dir / "bench_launch.json").read_text())["launched"]
            summary = json.loads((run_dir / "summary.json").read_text())
            full = {"task": task, "staleness": int(staleness[1:]), "loss": loss, "seed": int(seed), "label": label,
                    "run_dir": str(run_dir), **rml.analyse(run_dir, launched)}
            uninformative = {k: summary.get(k) for k in (
                "groups_dropped_uninformative", "uninformative_share", "completions_truncated")}
            runs.append(headline({**full, "steps_trained": summary["steps"], "learner": _learner_work(run_dir),
                                  "uninformative": uninformative}))
    return runs


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    args = parse_args(argv)
    out = Path(args.out)
    if args.reanalyse:
        save(out, reanalyse(Path(args.work_dir)), argv)
        print(json.dumps({k: v for k, v in json.loads(out.read_text()).items() if k != "runs"}, indent=2))
        return 0
    tasks, seeds = args.tasks.split(","), [int(s) for s in args.seeds.split(",")]
    runs: list[dict] = []
    parts = args.parts.split(",")
    for task in tasks:
        if "objectives" in parts:
            for loss in args.losses.split(","):
                for seed in seeds:
                    runs.append(run(task, loss, seed, args, []))
                    save(out, runs, argv)  # kept as each run ends
        if "drop" in parts:
            for seed in seeds:
                for label, on in (("drop-on", "true"), ("drop-off", "false")):
                    done = runs + kept_runs(out, provenance(ROOT, argv))
                    if label == "drop-on" and any(r["task"] == task and r["seed"] == seed and r["loss"] == "tis"
                                                  and not r["label"] for r in done):
                        continue  # the `tis` run above is this one: dropping is on by default
                    runs.append(run(task, "tis", seed, args, [f"grpo.drop_uninformative_groups={on}"], label))
                    save(out, runs, argv)
    print(json.dumps({k: v for k, v in json.loads(out.read_text()).items() if k != "runs"}, indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
