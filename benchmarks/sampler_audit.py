"""The seeded sampler's audit on the real SmolLM2-135M-Instruct: how often an honest worker's
tokens are flagged (false positives), and how fast a worker that chooses its tokens is caught.

Honest workers: the HF engine in fp32 (CPU workers) with a float32 wire, and computing in bf16
(as a GPU engine does) with a bfloat16 wire, or the vLLM engine the same two ways (fp32 is what
it computes in on the CPU by default, bf16 on a GPU; run from the vLLM venv), draw groups of
the one-digit addition prompts (G = 8, up to 8 new tokens, T = 1) with the seeded sampler, each
group under its own seed. The learner recomputes each group under the published version in fp32
and measures how far every token falls short of the sampler's choice; a group is a false
positive at margin m when any token falls short by more than m.

The token-choosing worker returns greedy completions (the likeliest tokens: what a worker that
wants its answers right returns) with their true log-probs, which pass the log-prob audit. The
share of its groups flagged at the default margin, p, gives the groups it gets through before
quarantine: with audit.recompute_fraction f and audit.flags_to_quarantine q, about q / (p f)
groups on average (the audit picks groups by a keyed hash).

    .venv/bin/python benchmarks/sampler_audit.py --groups 500
    .venv-vllm/bin/python benchmarks/sampler_audit.py --engines vllm-fp32,vllm-bf16 --groups 1000

Results go to benchmarks/results/sampler_audit[_tiny][_vllm].json (_vllm when a vLLM engine ran).
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "src"))
sys.path.insert(0, str(ROOT / "benchmarks"))

import torch  # noqa: E402
from audit_honest_diff import engine_for, prompts, trained_like  # noqa: E402

from echo2.config.audit import AuditConfig  # noqa: E402
from echo2.learner.sampler_audit import groups_shortfalls  # noqa: E402
from echo2.models.embedded import fetch  # noqa: E402
from echo2.models.loading import load_model, load_tokenizer  # noqa: E402
from echo2.models.weights import model_payload, payload_tensors  # noqa: E402
from echo2.protocol.messages import RolloutCompletion, TrainGroup  # noqa: E402
from echo2.rollout.engine import GenRequest  # noqa: E402

MARGINS = (0.05, 0.1, 0.2, 0.3, 0.5, 1.0)
ENGINE_WIRES = {"hf-fp32": ("float32", torch.float32), "hf-bf16": ("bfloat16", torch.bfloat16),
         "vllm-fp32": ("float32", torch.float32), "vllm-bf16": ("bfloat16", torch.bfloat16)}
"""Each engine configuration (audit_honest_diff.engine_for) and the wire dtype its versions come in."""


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--engines", default="hf-fp32,hf-bf16", help=", ".join(ENGINE_WIRES))
    parser.add_argument("--groups", type=int, default=500, help="honest groups per engine")
    parser.add_argument("--groups-bf16", type=int, default=None,
                        help="honest groups of the bf16 engine (default: --groups; bf16 on a CPU is slow)")
    parser.add_argument("--honest-budget-s", type=float, default=None,
                        help="stop drawing honest groups after this many seconds per engine (the count reached is "
                             "reported as honest_groups, the count asked for as honest_groups_wanted)")
    parser.add_argument("--chosen-groups", type=int, default=64, help="groups of the token-choosing worker")
    parser.add_argument("--group-size", type=int, default=8)
    parser.add_argument("--new-tokens", type=int, default=8)
    parser.add_argument("--prompts", type=int, default=16, help="prompts per generate call")
    parser.add_argument("--model", choices=("smollm2", "tiny"), default="smollm2",
                        help="tiny: the 1M-parameter character model (fast: thousands of groups)")
    parser.add_argument("--out", default=None, help="default: benchmarks/results/sampler_audit[_tiny][_vllm].json")
    args = parser.parse_args(argv)
    unknown = [e for e in args.engines.split(",") if e not in ENGINE_WIRES]
    if unknown:
        parser.error(f"--engines: unknown {unknown} (known: {', '.join(ENGINE_WIRES)})")
    return args


def honest_groups(engine, rows, args, seed0: int) -> list[TrainGroup]:
    seeds = [seed0 + i for i in range(len(rows))]
    out = engine.generate([GenRequest(r, args.group_size, 1.0, args.new_tokens, seed=s)
                           for r, s in zip(rows, seeds, strict=True)])
    return [TrainGroup(lease_id=f"g{s}", prompt_index=i, prompt_ids=r, version=1, worker_id="honest",
                       rewards=[0.0] * args.group_size, sampling_seed=s,
                       completions=[RolloutCompletion(token_ids=c.token_ids, logprobs=c.logprobs) for c in comps])
            for i, (r, s, comps) in enumerate(zip(rows, seeds, out, strict=True))]


def chosen_groups(engine, rows, args, seed0: int) -> list[TrainGroup]:
    """Greedy tokens under the seeds the coordinator gave (their log-probs are the true ones:
    the sampler check is what must catch them)."""
    out = []
    for i, r in enumerate(rows):
        ids = engine.greedy([r] * args.group_size, args.new_tokens)
        out.append(TrainGroup(lease_id=f"c{seed0 + i}", prompt_index=i, prompt_ids=r, version=1, worker_id="chooser",
                              rewards=[0.0] * args.group_size, sampling_seed=seed0 + i,
                              completions=[RolloutCompletion(token_ids=c, logprobs=[0.0] * len(c)) for c in ids]))
    return out


def worst_shortfalls(masters, payload, groups, pad_id: int) -> list[float]:
    """Each group's largest shortfall, the groups checked together as the learner checks one
    version's groups (its default pass layout and budgets)."""
    state = payload_tensors(payload)
    return [float(s.max()) for s in groups_shortfalls(masters, state, groups, temperature=1.0, pad_id=pad_id)]


def flagged_share(worst: list[float], margin: float) -> float:
    return sum(w > margin for w in worst) / len(worst)


def run_config(name, *, source, masters, rows, args, pad_id) -> dict:
    wire_name, wire = ENGINE_WIRES[name]
    engine = engine_for(name, source)
    payload = model_payload(masters, wire)
    engine.load_state_dict(payload_tensors(payload))
    started, worst, seed = time.perf_counter(), [], 1000
    wanted = args.groups_bf16 if wire is torch.bfloat16 and args.groups_bf16 is not None else args.groups
    while len(worst) < wanted and (args.honest_budget_s is None
                                   or time.perf_counter() - started < args.honest_budget_s):
        batch = rows[: min(len(rows), wanted - len(worst))]
        worst += worst_shortfalls(masters, payload, honest_groups(engine, batch, args, seed), pad_id)
        seed += len(batch)
        print(f"{name}: {len(worst)}/{wanted} honest groups", file=sys.stderr, flush=True)
    honest_s = time.perf_counter() - started  # generation and the learner's recompute, per group below
    chooser = []
    while len(chooser) < args.chosen_groups:
        batch = rows[: min(len(rows), args.chosen_groups - len(chooser))]
        chooser += worst_shortfalls(masters, payload, chosen_groups(engine, batch, args, seed), pad_id)
        seed += len(batch)
    audit = AuditConfig()
    caught = flagged_share(chooser, audit.sampler_margin)
    return {"engine": name, "wire_dtype": wire_name, "honest_groups": len(worst), "honest_groups_wanted": wanted,
            "chosen_groups": len(chooser),
            "tokens_per_group_max": args.group_size * args.new_tokens,
            "honest_false_positive_rate": {str(m): flagged_share(worst, m) for m in MARGINS},
            "honest_largest_shortfall": max(worst),
            "chooser_flagged_share": {str(m): flagged_share(chooser, m) for m in MARGINS},
            "chooser_groups_until_quarantine_at_defaults": (
                audit.flags_to_quarantine / (caught * audit.recompute_fraction) if caught else None),
            "honest_seconds_per_group": round(honest_s / len(worst), 3),
            "seconds": round(time.perf_counter() - started, 1)}


def model_source(args) -> tuple[str, list[list[int]] | None]:
    """The model's directory, and the tiny model's prompts (SmolLM2's come from its chat template)."""
    if args.model == "smollm2":
        return str(fetch("smollm2-135m-instruct", str(ROOT / "runs/.cache"), log=lambda line: None).hf_dir), None
    import tempfile

    from echo2.config.run import ModelConfig
    from echo2.models.tiny import save_tiny

    out = Path(tempfile.mkdtemp(prefix="sampler-audit-"))
    save_tiny(ModelConfig(hidden_size=32, num_layers=1, num_heads=2, intermediate_size=64), out, seed=0)
    tokenizer = load_tokenizer(str(out))
    rows = [tokenizer.encode(f"{a}+{b}=", add_special_tokens=False) for a in range(4) for b in range(4)]
    return str(out), rows[: args.prompts]


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    torch.manual_seed(0)
    source, rows = model_source(args)
    masters, tokenizer = load_model(source), load_tokenizer(source)
    trained_like(masters)
    rows = rows or prompts(tokenizer, args.prompts)
    results = [run_config(name, source=source, masters=masters, rows=rows, args=args, pad_id=tokenizer.pad_token_id)
               for name in args.engines.split(",")]
    for row in results:
        print(json.dumps(row), flush=True)
    audit = AuditConfig()
    model = ("SmolLM2-135M-Instruct (dequantized Q4_1 GGUF)" if args.model == "smollm2" else
             "the tiny character model (untrained, 1-layer Qwen3)")
    out = {"model": model + ", weights moved ~1e-3 relative", "new_tokens": args.new_tokens,
           "group_size": args.group_size,
           "default_margin": audit.sampler_margin, "recompute_fraction": audit.recompute_fraction,
           "flags_to_quarantine": audit.flags_to_quarantine, "runs": results}
    vllm = any(name.startswith("vllm") for name in args.engines.split(","))
    tiny = "" if args.model == "smollm2" else "_tiny"
    default = f"benchmarks/results/sampler_audit{tiny}{'_vllm' if vllm else ''}.json"
    Path(args.out or ROOT / default).write_text(json.dumps(out, indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
