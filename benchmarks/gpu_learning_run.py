"""The real-model learning run on a GPU machine (`benchmarks/gpu_smoke.sh`, step 5): `echo2 run`
with configs/smollm2_addition.toml's settings, the learner in bf16-mixed on the GPU and its HF
workers generating on the same GPU, reporting learner tokens/s (prompt and completion apart),
generation tokens/s per worker, the learner's peak memory and step times.

The model is SmolLM2-135M-Instruct when `echo2 models fetch` has it in runs/.cache (or the hub
id with --model); on a machine the 98 MB file cannot be carried to, the Qwen3-0.6B architecture,
random-initialised, with the character tokenizer (throughput only: its accuracy means nothing).

    python benchmarks/gpu_learning_run.py --device cuda --out benchmarks/results/gpu_learning_run.json
    python benchmarks/gpu_learning_run.py --device cpu --arch tiny --steps 3   # the script's own check
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "src"))
sys.path.insert(0, str(ROOT / "benchmarks"))

from load.provenance import provenance  # noqa: E402


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--device", default="cuda")
    parser.add_argument("--arch", default="qwen3-0.6b", help="random-init architecture when SmolLM2 is not at hand")
    parser.add_argument("--model", default="", help="a model directory or hub id to use instead")
    parser.add_argument("--steps", type=int, default=10)
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--new-tokens", type=int, default=64)
    parser.add_argument("--work-dir", default=str(ROOT / "runs" / "gpu-learning-run"))
    parser.add_argument("--out", default=str(ROOT / "benchmarks/results/gpu_learning_run.json"))
    return parser.parse_args(argv)


def model_source(args: argparse.Namespace) -> tuple[str, str]:
    """(source, what it is)."""
    if args.model:
        return args.model, args.model
    fetched = sorted((ROOT / "runs" / ".cache").glob("base-*/echo2_prepared.json"))
    for marker in fetched:
        if "SmolLM2" in json.loads(marker.read_text()).get("gguf", ""):
            return str(marker.parent), "SmolLM2-135M-Instruct (dequantized GGUF)"
    from engines import build_model  # benchmarks/engines.py: Qwen3 of an architecture, char tokenizer

    out = Path(args.work_dir) / "model"
    if not (out / "config.json").is_file():
        build_model(args.arch, out)
    return str(out), f"{args.arch} architecture, random init, character tokenizer (throughput only)"


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    source, what = model_source(args)
    run_dir = Path(args.work_dir) / "run"
    subprocess.run(["rm", "-rf", str(run_dir)], check=True)
    sets = [f"run_dir={run_dir}", f"model.source={source}", f"train.steps={args.steps}", "train.max_staleness=1",
            f"learner.device={args.device}", f"workers.worker.device={args.device}", f"workers.count={args.workers}",
            f"sampling.max_new_tokens={args.new_tokens}", "train.eval_every=5", "report.plots=false"]
    command = [sys.executable, "-m", "echo2", "run", "--config", str(ROOT / "configs/smollm2_addition.toml")]
    for item in sets:
        command += ["--set", item]
    started = time.time()
    done = subprocess.run(command, capture_output=True, text=True, timeout=1800, cwd=ROOT)
    if done.returncode != 0:
        print(done.stdout[-3000:], done.stderr[-3000:], file=sys.stderr)
        return done.returncode
    summary = json.loads((run_dir / "summary.json").read_text())
    steps = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()
             if '"train_step"' in line]
    result = {
        "benchmark": "gpu_learning_run", "device": args.device, "model": what, "steps": summary["steps"],
        "wall_s": round(time.time() - started, 1), "learner_tokens_per_s": summary.get("learner_tokens_per_s"),
        "generation_tokens_per_s": summary.get("tokens_per_s"),
        "learner_peak_memory_gib": round((summary.get("learner_peak_memory_bytes") or 0) / 2**30, 3),
        "train_s_per_step": [round(s["train_s"], 3) for s in steps],
        "learner_utilization": summary.get("learner_utilization"),
        "accuracy_before_after": [summary.get("accuracy_before"), summary.get("accuracy_after")],
        "settings": sets,
        "provenance": provenance(ROOT, sys.argv[1:] if argv is None else argv),  # it adds the interpreter and script
    }
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(result, indent=2) + "\n")
    print(json.dumps(result, indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
