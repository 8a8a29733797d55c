"""Bytes per version on the wire: full bf16 snapshots, lossless deltas (both codecs of
echo2.broadcast.delta) and LoRA adapters, side by side, on a Qwen3-architecture model of >= 100M
parameters (random init, no download) trained at RL learning rates.

The model has the width of Qwen3-0.6B (hidden 1024, 16 heads of 128, 8 KV heads, MLP 3072,
tied embeddings) with 8 layers and a 32k vocabulary: 159M parameters. An adapter's share of a
version falls with width (~2r/hidden per layer), so the benchmark also gives the exact adapter
bytes of the real Qwen3-0.6B and Qwen3-8B shapes (built on the meta device, no memory).

Training is next-token cross-entropy on random tokens with AdamW, the learner's optimizer: what
matters for the bytes is how far each weight moves per step, and Adam moves every weight by about
lr whatever the loss (its update is m / sqrt(v), ~sign(g) early on). Each version is the fp32
master cast to the bf16 wire (echo2.models.weights.model_payload, what the learner publishes).

    python benchmarks/delta_bytes.py --out benchmarks/results/delta_bytes_cpu.json
    python benchmarks/delta_bytes.py --device cuda --out $OUT/delta_bytes_gpu.json

Goals (issue 15), at lr 1e-6: delta + zstd <= 15% of the full bf16 bytes, LoRA <= 2%.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "src"))
sys.path.insert(0, str(ROOT / "benchmarks"))

from load.provenance import provenance  # noqa: E402

MEASURES = ("src/echo2/broadcast/delta.py", "src/echo2/models/weights.py", "src/echo2/models/lora.py",
            "src/echo2/protocol/manifest.py", "benchmarks/delta_bytes.py")
"""The code its results measure (benchmarks/check.py lists a result as stale when it changed)."""

GB = 1e9
LORA_TARGETS = ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--device", default="cpu", choices=["cpu", "cuda"])
    parser.add_argument("--steps", type=int, default=20)
    parser.add_argument("--lrs", default="1e-6,1e-5")
    parser.add_argument("--hidden", type=int, default=1024)
    parser.add_argument("--layers", type=int, default=8)
    parser.add_argument("--intermediate", type=int, default=3072)
    parser.add_argument("--heads", type=int, default=16)
    parser.add_argument("--kv-heads", type=int, default=8)
    parser.add_argument("--head-dim", type=int, default=128)
    parser.add_argument("--vocab", type=int, default=32768)
    parser.add_argument("--batch", type=int, default=2)
    parser.add_argument("--seq", type=int, default=64)
    parser.add_argument("--lora-r", type=int, default=16)
    parser.add_argument("--lora-alpha", type=int, default=32)
    parser.add_argument("--codecs", default="sub-zstd,xor-zstd")
    parser.add_argument("--out", default="")
    return parser.parse_args(argv)


def build_model(args, device: str):
    import torch
    from transformers import Qwen3Config, Qwen3ForCausalLM

    torch.manual_seed(0)
    config = Qwen3Config(vocab_size=args.vocab, hidden_size=args.hidden, intermediate_size=args.intermediate,
                         num_hidden_layers=args.layers, num_attention_heads=args.heads,
                         num_key_value_heads=args.kv_heads, head_dim=args.head_dim, tie_word_embeddings=True,
                         max_position_embeddings=max(512, args.seq))
    return Qwen3ForCausalLM(config).to(device)


# the real shapes (config.json of Qwen/Qwen3-0.6B and Qwen/Qwen3-8B)
REAL_SHAPES = {
    "Qwen3-0.6B": dict(hidden_size=1024, intermediate_size=3072, num_hidden_layers=28, num_attention_heads=16,
                       num_key_value_heads=8, head_dim=128, vocab_size=151936, tie_word_embeddings=True),
    "Qwen3-8B": dict(hidden_size=4096, intermediate_size=12288, num_hidden_layers=36, num_attention_heads=32,
                     num_key_value_heads=8, head_dim=128, vocab_size=151936, tie_word_embeddings=False),
}


def lora_at_scale(args) -> dict:
    """Exact bf16 bytes of a full version and of the adapters for the real model shapes."""
    import torch
    from transformers import Qwen3Config, Qwen3ForCausalLM

    from echo2.config.run import LoraConfig
    from echo2.models.lora import add_lora, lora_parameters

    out = {}
    for name, shape in REAL_SHAPES.items():
        with torch.device("meta"):
            model = Qwen3ForCausalLM(Qwen3Config(**shape))
        full_bytes = 2 * sum(p.numel() for p in model.parameters())  # tied weights count once
        add_lora(model, LoraConfig(r=args.lora_r, alpha=args.lora_alpha, target_modules=LORA_TARGETS))
        lora_bytes = 2 * sum(t.numel() for t in lora_parameters(model).values())
        out[name] = {"full_bytes": full_bytes, "lora_bytes": lora_bytes,
                     "ratio_to_full": round(lora_bytes / full_bytes, 5)}
    return out


def train(model, args, lr: float, device: str, on_version) -> None:
    """`args.steps` AdamW steps; `on_version(step)` after the initial weights and every step."""
    import torch

    params = [p for p in model.parameters() if p.requires_grad]
    optimizer = torch.optim.AdamW(params, lr=lr, weight_decay=0.0)
    generator = torch.Generator().manual_seed(1)
    on_version(0)
    for step in range(1, args.steps + 1):
        ids = torch.randint(0, args.vocab, (args.batch, args.seq), generator=generator).to(device)
        loss = model(input_ids=ids, labels=ids).loss
        loss.backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        on_version(step)


def measure_deltas(args, lr: float, device: str, codecs: list[str]) -> dict:
    import numpy as np
    import torch

    from echo2.broadcast.delta import decode_delta, encode_delta
    from echo2.models.weights import model_payload
    from echo2.protocol.manifest import content_index

    model = build_model(args, device)
    previous: list = []
    rows: dict[str, list[dict]] = {codec: [] for codec in codecs}
    changed: list[float] = []
    hash_s: list[float] = []

    def on_version(step: int) -> None:
        payload = memoryview(model_payload(model, torch.bfloat16)).toreadonly()
        if previous:
            base = previous[0]
            a, b = np.frombuffer(base, dtype=np.uint16), np.frombuffer(payload, dtype=np.uint16)
            changed.append(float((a != b).mean()))
            started = time.perf_counter()
            content_index(payload)  # the manifest's tensor hashes (learner) and their check (worker)
            hash_s.append(time.perf_counter() - started)
            for codec in codecs:
                started = time.perf_counter()
                delta = encode_delta(base, payload, codec=codec)
                encode_s = time.perf_counter() - started
                started = time.perf_counter()
                rebuilt = decode_delta(base, delta, codec=codec)
                decode_s = time.perf_counter() - started
                if bytes(rebuilt) != bytes(payload):
                    raise AssertionError(f"{codec}: version {step} did not rebuild bit for bit")
                rows[codec].append({"bytes": len(delta), "encode_s": encode_s, "decode_s": decode_s})
        previous[:] = [payload]

    started = time.perf_counter()
    train(model, args, lr, device, on_version)
    full_bytes = len(previous[0])
    out = {"train_and_measure_s": round(time.perf_counter() - started, 1),
           "changed_fraction_mean": round(sum(changed) / len(changed), 5),
           "full": {"bytes_per_version": full_bytes},
           "hash_s_per_gb": round(sum(hash_s) / len(hash_s) / (full_bytes / GB), 3)}
    for codec, codec_rows in rows.items():
        mean_bytes = sum(r["bytes"] for r in codec_rows) / len(codec_rows)
        out[codec] = {
            "bytes_per_version_mean": round(mean_bytes),
            "bytes_per_version_max": max(r["bytes"] for r in codec_rows),
            "ratio_to_full": round(mean_bytes / full_bytes, 4),
            "encode_s_per_gb": round(sum(r["encode_s"] for r in codec_rows) / len(codec_rows) / (full_bytes / GB), 3),
            "decode_s_per_gb": round(sum(r["decode_s"] for r in codec_rows) / len(codec_rows) / (full_bytes / GB), 3),
        }
    return out


def measure_lora(args, lr: float, device: str, full_bytes: int) -> dict:
    import torch

    from echo2.config.run import LoraConfig
    from echo2.models.lora import adapter_payload, add_lora

    model = add_lora(build_model(args, device), LoraConfig(r=args.lora_r, alpha=args.lora_alpha,
                                                            target_modules=LORA_TARGETS))
    sizes: list[int] = []
    train(model, args, lr, device, lambda step: sizes.append(len(adapter_payload(model, torch.bfloat16))))
    return {"bytes_per_version": max(sizes), "ratio_to_full": round(max(sizes) / full_bytes, 5),
            "r": args.lora_r, "alpha": args.lora_alpha, "target_modules": LORA_TARGETS,
            "trainable_params": sum(p.numel() for p in model.parameters() if p.requires_grad)}


def main(argv: list[str] | None = None) -> int:
    import torch

    args = parse_args(argv)
    if args.device == "cuda" and not torch.cuda.is_available():
        raise SystemExit("--device cuda: torch sees no GPU here")
    torch.set_num_threads(max(1, os.cpu_count() or 1))
    codecs = args.codecs.split(",")
    params = sum(p.numel() for p in build_model(args, "cpu").parameters())
    result: dict = {
        "benchmark": "delta_bytes", "provenance": provenance(ROOT, sys.argv[1:] if argv is None else argv),
        "device": args.device, "steps": args.steps, "wire_dtype": "bfloat16",
        "model": {"architecture": "Qwen3ForCausalLM (random init, tied embeddings)", "params": params,
                  "hidden": args.hidden, "layers": args.layers, "intermediate": args.intermediate,
                  "heads": args.heads, "kv_heads": args.kv_heads, "head_dim": args.head_dim, "vocab": args.vocab},
        "training": f"AdamW, next-token loss on random tokens, batch {args.batch} x {args.seq} tokens",
        "machine": {"python": platform.python_version(), "torch": torch.__version__, "cpus": os.cpu_count(),
                    "gpu": torch.cuda.get_device_name(0) if args.device == "cuda" else None},
        "runs": {},
    }
    for lr in [float(x) for x in args.lrs.split(",")]:
        run = measure_deltas(args, lr, args.device, codecs)
        run["lora"] = measure_lora(args, lr, args.device, run["full"]["bytes_per_version"])
        result["runs"][f"lr={lr:g}"] = run
        print(json.dumps({f"lr={lr:g}": run}), flush=True)
    result["lora_at_scale"] = lora_at_scale(args)
    result["goals"] = goals(result)
    text = json.dumps(result, indent=2)
    print(text)
    if args.out:
        Path(args.out).parent.mkdir(parents=True, exist_ok=True)
        Path(args.out).write_text(text + "\n")
    return 0


def goals(result: dict) -> dict:
    run = result["runs"].get("lr=1e-06")
    if run is None:
        return {}
    best = min(run[c]["ratio_to_full"] for c in run if c.endswith("-zstd"))
    return {"delta_at_most_15pct_of_full_at_lr_1e-6": best <= 0.15,
            "lora_at_most_2pct_of_full": run["lora"]["ratio_to_full"] <= 0.02,
            "params_at_least_100M": result["model"]["params"] >= 100e6}


if __name__ == "__main__":
    raise SystemExit(main())
