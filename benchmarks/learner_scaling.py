"""Step time of the learner as 1 rank and sharded over K ranks (FSDP2 under torchrun): the real
train_step on a synthetic GRPO batch, each rank its share of the micro-batches.

Each point runs in fresh processes (`torchrun --standalone --nproc-per-node K`; a plain 1-rank
point without torchrun). On the CPU, points share the machine's cores: K ranks get cores / K
threads each, so 1 rank and 2 ranks use the same cores, and the JSON says whether splitting the
micro-batches over processes beats one process's own threads. On CUDA the ranks are the GPUs
(one each); with a single GPU the second point is FSDP on 1 rank, which runs the sharded code
path (bf16 parameters, fp32 reduction, NCCL) and shows what FSDP itself costs there.

    python benchmarks/learner_scaling.py                       # CPU: 1 and 2 ranks
    python benchmarks/learner_scaling.py --device cuda --arch qwen3-0.6b   # what gpu_smoke.sh runs

Prints one JSON document (and writes it to --out): every point's median step time, tokens/s,
and `speedup` = the first point's step time (1 rank, all the cores) / each point's step time.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "src"))

from fresh_process import machine  # noqa: E402  (benchmarks/, beside this file)
from learner_memory import ARCHS as MEMORY_ARCHS  # noqa: E402
from learner_memory import _groups  # noqa: E402

ARCHS = {
    # narrow and shallow with a small vocabulary, so the CPU measures the decoder layers (what
    # FSDP shards and gathers) rather than one huge LM head
    "cpu-small": dict(hidden_size=256, intermediate_size=768, num_hidden_layers=4, num_attention_heads=4,
                      num_key_value_heads=4, head_dim=64, vocab_size=8192),
    "qwen3-0.6b": {**MEMORY_ARCHS["qwen3-0.6b"], "vocab_size": 151_936},
}
# a collective that waits longer than this on a benchmark this size is a hang, not a slow step
POINT_TIMEOUT_S = 900


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--arch", choices=sorted(ARCHS), default="cpu-small")
    parser.add_argument("--device", default="cpu", help="cpu or cuda (ranks: every GPU torch sees)")
    parser.add_argument("--precision", default="auto", choices=["auto", "fp32", "bf16-mixed"])
    parser.add_argument("--ranks", default="",
                        help="rank counts to measure (default: 1,2 on the CPU, the GPUs on CUDA)")
    parser.add_argument("--batch", type=int, default=32, help="completions per step")
    parser.add_argument("--group-size", type=int, default=8)
    parser.add_argument("--prompt-tokens", type=int, default=32)
    parser.add_argument("--completion-tokens", type=int, default=96)
    parser.add_argument("--micro-batch-tokens", type=int, default=1024)
    parser.add_argument("--steps", type=int, default=3, help="timed steps per point, after one warm-up step")
    parser.add_argument("--out", default=str(ROOT / "benchmarks/results/learner_scaling_cpu.json"))
    parser.add_argument("--child", help=argparse.SUPPRESS)
    return parser.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    if args.child:
        return child(json.loads(args.child))
    load_before = round(os.getloadavg()[0], 2)
    points = [run_point(point) for point in plan_points(args)]
    for point in points:
        print(json.dumps({k: point.get(k) for k in ("ranks", "sharded", "threads", "step_s", "error")}),
              file=sys.stderr)
    # the plain learner on all the cores (the first point) is the baseline
    base = points[0].get("step_s")
    for point in points:
        if base and "step_s" in point:
            point["speedup"] = round(base / point["step_s"], 3)
    result = {"benchmark": "learner_scaling", "machine": machine(args.device), "settings": _settings(args),
              # other work on the machine while it ran (1-minute load average, before and after)
              "load_average": [load_before, round(os.getloadavg()[0], 2)], "points": points}
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(result, indent=2) + "\n")
    print(json.dumps(result, indent=2))
    return 0 if all("error" not in p for p in points) else 1


def _settings(args) -> dict:
    return {k: v for k, v in vars(args).items() if k not in ("child", "out")}


def plan_points(args) -> list[dict]:
    """(ranks, sharded, threads) per point: the plain learner first, then each sharded size."""
    cores = os.cpu_count() or 1
    if args.device.startswith("cuda"):
        import torch

        gpus = torch.cuda.device_count()
        if gpus == 0:
            raise SystemExit("learner_scaling: --device cuda, but torch sees no GPU")
        sizes = [int(r) for r in args.ranks.split(",")] if args.ranks else [gpus]
        shapes = [(1, False)] + [(k, True) for k in sizes]
    else:
        sizes = [int(r) for r in args.ranks.split(",")] if args.ranks else [1, 2]
        shapes = [(k, k > 1) for k in sizes]
    common = {k: v for k, v in _settings(args).items() if k != "ranks"}
    points = [{**common, "ranks": k, "sharded": sharded, "threads": max(1, cores // k)} for k, sharded in shapes]
    if not args.device.startswith("cuda") and cores > 1:
        # one rank on one core: what each of K ranks gets, so the JSON separates sharding's cost
        # from how well one process uses several cores
        points.insert(1, {**common, "ranks": 1, "sharded": False, "threads": 1})
    return points


def run_point(point: dict) -> dict:
    """The point's processes; rank 0 writes its measurement to a file (JSON) they share."""
    started = time.perf_counter()
    with tempfile.TemporaryDirectory() as tmp:
        result = Path(tmp) / "result.json"
        args = [str(Path(__file__).resolve()), "--child", json.dumps({**point, "result": str(result)})]
        cmd = [sys.executable, *args] if not point["sharded"] else \
            [sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc-per-node={point['ranks']}", *args]
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=POINT_TIMEOUT_S,
                              env={**os.environ, "PYTHONUNBUFFERED": "1", "OMP_NUM_THREADS": str(point["threads"])})
        if proc.returncode != 0 or not result.is_file():
            return {**point, "error": " | ".join((proc.stdout + proc.stderr).strip().splitlines()[-6:]),
                    "wall_s": time.perf_counter() - started}
        return {**point, **json.loads(result.read_text()), "wall_s": round(time.perf_counter() - started, 1)}


# ---- the child: one rank of one point ------------------------------------------------------------


def child(point: dict) -> int:
    import torch
    from transformers import Qwen3Config, Qwen3ForCausalLM

    from echo2.config.run import GRPOConfig, LearnerConfig
    from echo2.learner.distributed import init_ranks
    from echo2.learner.precision import peak_memory_bytes, resolve_precision
    from echo2.learner.sharding import shard_model
    from echo2.learner.step import train_step

    torch.set_num_threads(point["threads"])
    precision = resolve_precision(LearnerConfig(device=point["device"], precision=point["precision"]))
    ranks, device = init_ranks(precision.device, shard_one=point["sharded"])
    precision = type(precision)(device, precision.autocast_dtype)
    arch = ARCHS[point["arch"]]
    config = Qwen3Config(max_position_embeddings=4096, tie_word_embeddings=True, **arch)
    torch.manual_seed(0)
    with torch.device("cpu" if ranks.sharded else device):
        model = Qwen3ForCausalLM(config)  # fp32 master weights
    if ranks.sharded:
        shard_model(model, precision, ranks)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-5)
    grpo = GRPOConfig(micro_batch_tokens=point["micro_batch_tokens"])

    def step(seed: int) -> dict:
        groups = _groups(point["batch"], point["group_size"], point["prompt_tokens"], point["completion_tokens"], seed,
                         vocab=arch["vocab_size"])
        stats = train_step(model, optimizer, groups, step=1, cfg=grpo, temperature=1.0, pad_id=0,
                           precision=precision, ranks=ranks)
        if device.type == "cuda":
            torch.cuda.synchronize()
        return stats

    step(seed=1)  # warm-up: kernels, allocator, optimizer states, the process group's first collectives
    times = []
    for seed in range(2, 2 + point["steps"]):
        started = time.perf_counter()
        stats = step(seed)
        times.append(time.perf_counter() - started)
    tokens = point["batch"] * (point["prompt_tokens"] + point["completion_tokens"])
    median = statistics.median(times)
    if ranks.leader:
        Path(point["result"]).write_text(json.dumps({
            "step_s": round(median, 4), "step_s_all": [round(t, 4) for t in times],
            "tokens_per_s": round(tokens / median),
            "micro_batches": stats["micro_batches"], "skipped_step": stats["skipped"], "loss": stats["loss"],
            "params": sum(p.numel() for p in model.parameters()), "precision": precision.name,
            "device_used": str(device), "peak_memory_bytes_rank0": peak_memory_bytes(device),
            "backend": torch.distributed.get_backend() if ranks.sharded else None,
        }))
    ranks.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
