"""How far an honest worker's behaviour log-probs are from what the rollout audit recomputes, on
the real SmolLM2-135M-Instruct: the number audit.max_mean_abs_logprob_diff is set from.

For each wire dtype (float32, bfloat16) a version is published from fp32 masters a little way
from the base (as a learner's are after some steps: every weight moved by ~1e-3 relative, so
bf16 rounding changes it), and each engine loads it as a worker does and samples groups of the
one-digit addition prompts (G = 8, up to 8 and 32 new tokens). The learner's audit then scores
the same tokens two ways:
- under the wire version it published (what the audit does now): the honest difference;
- under its fp32 masters (what it did before for groups at its current version).

Engines: the HF engine in fp32 (CPU workers), the HF engine computing in bf16 (what a bf16 GPU
engine does), and vLLM when it imports (the venv `make test-vllm` builds). Run it once per venv;
results merge into --out:

    .venv/bin/python benchmarks/audit_honest_diff.py
    .venv-vllm/bin/python benchmarks/audit_honest_diff.py --engines vllm
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "src"))

import torch  # noqa: E402

from echo2.config.run import GRPOConfig  # noqa: E402
from echo2.config.worker import WorkerConfig  # noqa: E402
from echo2.learner.audit import recompute_mean_abs_diff  # noqa: E402
from echo2.models.embedded import fetch  # noqa: E402
from echo2.models.loading import load_model, load_tokenizer  # noqa: E402
from echo2.models.weights import model_payload, payload_tensors, unique_tensors  # noqa: E402
from echo2.protocol.messages import RolloutCompletion, TrainGroup  # noqa: E402
from echo2.rollout.engine import GenRequest  # noqa: E402
from echo2.rollout.engine_factory import make_engine  # noqa: E402

WIRES = {"float32": torch.float32, "bfloat16": torch.bfloat16}


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--engines", default="hf-fp32,hf-bf16", help="hf-fp32, hf-bf16, vllm (fp32), vllm-bf16")
    parser.add_argument("--prompts", type=int, default=16)
    parser.add_argument("--group-size", type=int, default=8)
    parser.add_argument("--new-tokens", default="8,32")
    parser.add_argument("--out", default=str(ROOT / "benchmarks/results/audit_honest_diff.json"))
    return parser.parse_args(argv)


def trained_like(model, seed: int = 0) -> None:
    """Move every weight by ~1e-3 of itself: low mantissa bits set, as training leaves them."""
    generator = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in model.parameters():
            p.mul_(1.0 + 1e-3 * torch.randn(p.shape, generator=generator))


def prompts(tokenizer, count: int) -> list[list[int]]:
    rows = [json.loads(line) for line in (ROOT / "configs/data/addition_1digit.jsonl").read_text().splitlines()]
    out = []
    for row in rows[:count]:
        text = tokenizer.apply_chat_template(
            [{"role": "user", "content": f"{row['question']}\nAnswer with the number only."}], tokenize=False,
            add_generation_prompt=True)
        out.append(tokenizer(text, add_special_tokens=False)["input_ids"])
    return out


def engine_for(name: str, source: str):
    """hf-fp32, hf-bf16, vllm-fp32 (also "vllm": the vLLM engine's CPU default), vllm-bf16."""
    if name.startswith("vllm"):
        dtype = "bfloat16" if name == "vllm-bf16" else "float32"
        cfg = WorkerConfig(engine="vllm", device="cpu", vllm={"dtype": dtype, "seed": 0})
    else:
        cfg = WorkerConfig(engine="hf", device="cpu", dtype="float32" if name == "hf-fp32" else "bfloat16")
    return make_engine(cfg, source)


def groups_from(engine, rows: list[list[int]], group_size: int, new_tokens: int) -> list[TrainGroup]:
    out = engine.generate([GenRequest(r, group_size, 1.0, new_tokens) for r in rows])
    return [TrainGroup(lease_id=f"g{i}", prompt_index=i, prompt_ids=r, version=1, worker_id="honest",
                       rewards=[0.0] * group_size,
                       completions=[RolloutCompletion(token_ids=c.token_ids, logprobs=c.logprobs) for c in comps])
            for i, (r, comps) in enumerate(zip(rows, out, strict=True))]


def stats(diffs: list[float]) -> dict:
    ordered = sorted(diffs)
    return {"groups": len(diffs), "max": max(diffs), "p99": ordered[min(len(ordered) - 1, int(0.99 * len(ordered)))],
            "mean": statistics.fmean(diffs)}


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    torch.manual_seed(0)
    source = str(fetch("smollm2-135m-instruct", str(ROOT / "runs/.cache"), log=lambda line: None).hf_dir)
    masters, tokenizer = load_model(source), load_tokenizer(source)
    trained_like(masters)
    rows = prompts(tokenizer, args.prompts)
    grpo = GRPOConfig()
    results = []
    for engine_name in args.engines.split(","):
        engine = engine_for(engine_name, source)
        for wire_name, wire in WIRES.items():
            payload = model_payload(masters, wire)
            engine.load_state_dict(payload_tensors(payload))
            for new_tokens in (int(n) for n in args.new_tokens.split(",")):
                groups = groups_from(engine, rows, args.group_size, new_tokens)
                under_wire = recompute_mean_abs_diff(masters, payload_tensors(payload), groups, grpo=grpo,
                                                     temperature=1.0, pad_id=tokenizer.pad_token_id)
                under_masters = recompute_mean_abs_diff(masters, dict(unique_tensors(masters)), groups,
                                                        grpo=grpo, temperature=1.0,
                                                        pad_id=tokenizer.pad_token_id)
                row = {"engine": engine_name, "wire_dtype": wire_name, "max_new_tokens": new_tokens,
                       "tokens": sum(len(c.token_ids) for g in groups for c in g.completions),
                       "under_wire_version": stats(under_wire), "under_fp32_masters": stats(under_masters)}
                print(json.dumps(row), flush=True)
                results.append(row)
        if hasattr(engine, "close"):
            engine.close()
    out = Path(args.out)
    merged = json.loads(out.read_text()) if out.is_file() else {"runs": []}
    done = {(r["engine"], r["wire_dtype"], r["max_new_tokens"]) for r in results}
    merged["runs"] = [r for r in merged["runs"] if (r["engine"], r["wire_dtype"], r["max_new_tokens"]) not in done]
    merged["runs"] += results
    merged["model"] = "SmolLM2-135M-Instruct (dequantized Q4_1 GGUF), weights moved ~1e-3 relative"
    worst = {e: max(r["under_wire_version"]["max"] for r in merged["runs"] if r["engine"] == e)
             for e in {r["engine"] for r in merged["runs"]}}
    merged["largest_honest_diff_by_engine"] = worst
    out.write_text(json.dumps(merged, indent=2))
    print(json.dumps({"largest_honest_diff_by_engine": worst}))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
