"""Peak memory and throughput of one learner step as the batch grows, at a fixed micro-batch
token budget: the learner's memory must follow the budget, not B.

Each (mode, B) point runs in a fresh process, so its peak is its own: resident set size on the
CPU (ru_maxrss), torch.cuda.max_memory_allocated on a GPU. The model is random-initialised from a
Qwen3 config with Qwen3's full 151,936-token vocabulary (no download); on the CPU it has few,
narrow layers so the whole sweep runs in minutes, on a GPU the Qwen3-0.6B architecture.

Modes, measured side by side in one run:
  micro        the learner as configured: micro-batches of --micro-batch-tokens, chunked LM head
  full_batch   the whole batch in one pass (micro_batch_tokens = 0), chunked LM head
  full_logits  the whole batch in one pass through the model's own [B, L, V] logits, as the
               learner worked before micro-batching (run only where it is predicted to fit)

    python benchmarks/learner_memory.py                 # CPU sweep, B in {8, 32, 128} x 256 tokens
    python benchmarks/learner_memory.py --arch qwen3-0.6b --device cuda --batches 128 \\
        --completion-tokens 1024 --modes micro          # what benchmarks/gpu_smoke.sh runs

Prints one JSON document (and writes it to --out): every point, and `checks.peak_growth` =
peak(largest B) / peak(smallest B) in micro mode, which must stay at or below 1.3.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "src"))

from fresh_process import child_main, machine  # noqa: E402  (benchmarks/, beside this file)
from fresh_process import run_point as run_point_in_fresh_process  # noqa: E402

VOCAB = 151_936  # Qwen3's tokenizer
ARCHS = {
    # few, narrow layers: the vocabulary (the LM head and its logits) is what stresses memory
    "tiny-wide-vocab": dict(hidden_size=64, intermediate_size=256, num_hidden_layers=2, num_attention_heads=4,
                            num_key_value_heads=4, head_dim=16),
    # Qwen/Qwen3-0.6B's config.json
    "qwen3-0.6b": dict(hidden_size=1024, intermediate_size=3072, num_hidden_layers=28, num_attention_heads=16,
                       num_key_value_heads=8, head_dim=128, rope_theta=1_000_000.0, rms_norm_eps=1e-6),
}
MAX_GROWTH = 1.3


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--arch", choices=sorted(ARCHS), default="tiny-wide-vocab")
    parser.add_argument("--device", default="cpu", help="cpu, cuda, cuda:N or auto")
    parser.add_argument("--precision", default="auto", choices=["auto", "fp32", "bf16-mixed"])
    parser.add_argument("--batches", default="8,32,128", help="B values: completions per step")
    parser.add_argument("--group-size", type=int, default=8)
    parser.add_argument("--prompt-tokens", type=int, default=32)
    parser.add_argument("--completion-tokens", type=int, default=256)
    parser.add_argument("--micro-batch-tokens", type=int, default=4096)
    parser.add_argument("--logprob-chunk-tokens", type=int, default=1024)
    parser.add_argument("--gradient-checkpointing", action="store_true")
    parser.add_argument("--modes", default="micro,full_batch,full_logits")
    parser.add_argument("--threads", type=int, default=os.cpu_count() or 1)
    parser.add_argument("--out", default=str(ROOT / "benchmarks/results/learner_memory_cpu.json"))
    parser.add_argument("--child", help=argparse.SUPPRESS)
    return parser.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    if args.child:
        return child_main(args.child, measure)
    points = []
    for mode in args.modes.split(","):
        for batch in (int(b) for b in args.batches.split(",")):
            point = {"mode": mode, "batch": batch, **vars(args)}
            del point["child"], point["out"], point["modes"], point["batches"]
            points.append(run_point(point))
            print(json.dumps({k: points[-1].get(k) for k in ("mode", "batch", "peak_bytes", "step_s", "skipped",
                                                              "error")}), file=sys.stderr, flush=True)
    result = {"benchmark": "learner_memory", "machine": machine(args.device), "settings": _settings(args),
              "points": points, "checks": checks(points)}
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(result, indent=2) + "\n")
    print(json.dumps(result, indent=2))
    return 0 if result["checks"].get("peak_growth_ok", True) else 1


def _settings(args) -> dict:
    return {k: v for k, v in vars(args).items() if k not in ("child", "out")}


def run_point(point: dict) -> dict:
    """One measurement in a fresh interpreter; a point predicted not to fit is skipped, and one
    that runs out of memory anyway is reported as such."""
    need = predicted_full_logits_bytes(point) if point["mode"] == "full_logits" else 0
    have = available_bytes(point["device"])
    if need and need > 0.7 * have:
        return {**point, "skipped": f"needs ~{need / 2**30:.1f} GiB of logits alone; {have / 2**30:.1f} GiB available"}
    return run_point_in_fresh_process(__file__, point)


def predicted_full_logits_bytes(point: dict) -> int:
    """[B, L, V] logits in the compute dtype, their fp32 copy and the log-softmax and its
    gradient: about four fp32-sized buffers."""
    rows = point["batch"]
    length = point["prompt_tokens"] + point["completion_tokens"]
    return 4 * rows * length * VOCAB * 4


def available_bytes(device: str) -> int:
    if device.startswith("cuda") or device == "auto":
        try:
            import torch

            if torch.cuda.is_available():
                return torch.cuda.mem_get_info()[0]
        except ImportError:
            pass
    with open("/proc/meminfo") as handle:
        info = dict(line.split(":", 1) for line in handle)
    return int(info["MemAvailable"].split()[0]) * 1024


def checks(points: list[dict]) -> dict:
    micro = sorted((p for p in points if p["mode"] == "micro" and "peak_bytes" in p), key=lambda p: p["batch"])
    if len(micro) < 2:
        return {}
    growth = micro[-1]["peak_bytes"] / micro[0]["peak_bytes"]
    out = {"peak_growth": round(growth, 3), "peak_growth_from_b": micro[0]["batch"],
           "peak_growth_to_b": micro[-1]["batch"],
           "peak_growth_limit": MAX_GROWTH, "peak_growth_ok": growth <= MAX_GROWTH}
    for p in micro:
        for other in ("full_batch", "full_logits"):
            q = next((x for x in points if x["mode"] == other and x["batch"] == p["batch"] and "peak_bytes" in x), None)
            if q:
                out[f"{other}_over_micro_peak_b{p['batch']}"] = round(q["peak_bytes"] / p["peak_bytes"], 3)
    return out


# ---- the child: one step, measured ------------------------------------------------------------


def measure(point: dict) -> dict:
    import torch
    from transformers import Qwen3Config, Qwen3ForCausalLM

    import echo2.learner.logprobs as logprobs
    from echo2.config.run import GRPOConfig, LearnerConfig
    from echo2.learner.precision import peak_memory_bytes, resolve_precision
    from echo2.learner.step import train_step
    from echo2.models.loading import enable_activation_checkpointing

    torch.set_num_threads(point["threads"])
    precision = resolve_precision(LearnerConfig(device=point["device"], precision=point["precision"]))
    device = precision.device
    config = Qwen3Config(vocab_size=VOCAB, max_position_embeddings=40_960, tie_word_embeddings=True,
                         **ARCHS[point["arch"]])
    torch.manual_seed(0)
    with device:
        model = Qwen3ForCausalLM(config)  # fp32 master weights, initialised where they live
    if point["gradient_checkpointing"]:
        enable_activation_checkpointing(model)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-5)
    if point["mode"] == "full_logits":
        logprobs.lean_head_supported = lambda model: False  # the model's own full logits
    budget = 0 if point["mode"] in ("full_batch", "full_logits") else point["micro_batch_tokens"]
    grpo = GRPOConfig(micro_batch_tokens=budget, logprob_chunk_tokens=point["logprob_chunk_tokens"])

    def step(batch: int, seed: int) -> dict:
        groups = _groups(batch, point["group_size"], point["prompt_tokens"], point["completion_tokens"], seed)
        return train_step(model, optimizer, groups, step=1, cfg=grpo, temperature=1.0, pad_id=0,
                          precision=precision)

    step(min(point["group_size"], point["batch"]), seed=1)  # warm-up: kernels, allocator, optimizer states
    if device.type == "cuda":
        torch.cuda.synchronize()
        torch.cuda.reset_peak_memory_stats(device)
    static = _current_bytes(device)
    stats = step(point["batch"], seed=2)
    if device.type == "cuda":
        torch.cuda.synchronize()
    peak = peak_memory_bytes(device)
    tokens = point["batch"] * (point["prompt_tokens"] + point["completion_tokens"])
    return {
        "peak_bytes": peak, "static_bytes": static, "step_s": stats["train_s"],
        "tokens_per_s": tokens / stats["train_s"], "completion_tokens_per_s": stats["tokens"] / stats["train_s"],
        "micro_batches": stats["micro_batches"], "skipped_step": stats["skipped"], "loss": stats["loss"],
        "params": sum(p.numel() for p in model.parameters()), "precision": precision.name, "device_used": str(device),
    }


def _current_bytes(device) -> int:
    import torch

    if device.type == "cuda":
        return int(torch.cuda.memory_allocated(device))
    with open("/proc/self/statm") as handle:
        return int(handle.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


def _groups(batch: int, group_size: int, prompt_tokens: int, completion_tokens: int, seed: int, vocab: int = VOCAB):
    """batch completions in groups: random tokens of exactly the stated lengths, mixed rewards."""
    from echo2.protocol.messages import RolloutCompletion, TrainGroup

    rng = random.Random(seed)
    groups = []
    for g in range(max(1, batch // group_size)):
        prompt = [rng.randrange(10, vocab) for _ in range(prompt_tokens)]
        completions = [RolloutCompletion(token_ids=[rng.randrange(10, vocab) for _ in range(completion_tokens)],
                                         logprobs=[-12.0] * completion_tokens) for _ in range(min(group_size, batch))]
        groups.append(TrainGroup(lease_id=f"{seed}-{g}", prompt_index=g, prompt_ids=prompt, version=1, worker_id="w",
                                 rewards=[float(i % 2) for i in range(len(completions))], completions=completions))
    return groups


if __name__ == "__main__":
    sys.exit(main())
