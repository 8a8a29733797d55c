"""How far an honest worker's behaviour log-probs are from what the rollout audit recomputes, on
the real SmolLM2-135M-Instruct: the number audit.max_mean_abs_logprob_diff is set from.

For each wire dtype (float32, bfloat16) a version is published from fp32 masters a little way
from the base (as a learner's are after some steps: every weight moved by ~1e-3 relative, so
bf16 rounding changes it), and each engine loads it as a worker does and samples groups of the
one-digit addition prompts (G = 8, up to 8 and 32 new tokens). The learner's audit then scores
the same tokens two ways:
- under the wire version it published (what the audit does now): the honest difference;
- under its fp32 masters (what it did before for groups at its current version).

The version test across groups (policy.evidence) models an honest worker by two rates, measured
here per engine and wire dtype (`version_fits`): honest groups are sampled with the seeded
sampler from a version claimed as such, with three older versions one optimizer-like step apart
(every weight moved by --step-sizes, in a random sign per step, as Adam's first steps move it),
and the learner's audit compares them with each older version as it does in a run:
- at the positions where the claimed version's seeded choice and an older one's differ by more
  than audit.version_margin, the share of tokens that are the claimed version's
  (audit.honest_match_rate models it), and how far the near-ties an engine flips reach;
- the groups whose log-probs fit an older version by the audit's margin, among those measured
  (audit.honest_logprob_fit_rate models it).

Engines: the HF engine in fp32 (CPU workers), the HF engine computing in bf16 (what a bf16 GPU
engine does), and vLLM when it imports (the venv `make test-vllm` builds), each run writing its
own result:

    .venv/bin/python benchmarks/audit_honest_diff.py
    .venv-vllm/bin/python benchmarks/audit_honest_diff.py --engines vllm \
        --out benchmarks/results/audit_honest_diff_vllm.json
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "src"))
sys.path.insert(0, str(ROOT / "benchmarks"))

import torch  # noqa: E402
from load.provenance import provenance  # noqa: E402

from echo2.config.audit import AuditConfig  # noqa: E402
from echo2.config.run import GRPOConfig  # noqa: E402
from echo2.config.worker import WorkerConfig  # noqa: E402
from echo2.learner.audit import Auditor, recompute_mean_abs_diff  # noqa: E402
from echo2.learner.precision import CPU_FP32  # noqa: E402
from echo2.learner.sampler_audit import groups_sampler_checks  # noqa: E402
from echo2.models.embedded import fetch  # noqa: E402
from echo2.models.loading import load_model, load_tokenizer  # noqa: E402
from echo2.models.weights import model_payload, payload_tensors, unique_tensors  # noqa: E402
from echo2.protocol.messages import RolloutCompletion, TrainGroup  # noqa: E402
from echo2.rollout.engine import GenRequest  # noqa: E402
from echo2.rollout.engine_factory import make_engine  # noqa: E402

WIRES = {"float32": torch.float32, "bfloat16": torch.bfloat16}
MEASURES = ("src/echo2/learner/audit.py", "src/echo2/learner/sampler_audit.py", "src/echo2/learner/version_check.py",
            "src/echo2/learner/logprobs.py", "src/echo2/rollout/hf_engine.py", "src/echo2/models/sampler.py",
            "benchmarks/audit_honest_diff.py")
"""The code its results measure (benchmarks/check.py)."""
OLDER_VERSIONS = 3


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--engines", default="hf-fp32,hf-bf16", help="hf-fp32, hf-bf16, vllm (fp32), vllm-bf16")
    parser.add_argument("--prompts", type=int, default=16)
    parser.add_argument("--group-size", type=int, default=8)
    parser.add_argument("--new-tokens", default="8,32")
    parser.add_argument("--step-sizes", default="1e-4,1e-5",
                        help="how far each weight moves per version in `version_fits` (1e-5: the SmolLM2 configs' lr)")
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


def groups_from(engine, rows: list[list[int]], group_size: int, new_tokens: int, *, version: int = 1,
                seeded: bool = False) -> list[TrainGroup]:
    seeds = [1000 + i if seeded else None for i in range(len(rows))]
    out = engine.generate([GenRequest(r, group_size, 1.0, new_tokens, seed=s)
                           for r, s in zip(rows, seeds, strict=True)])
    return [TrainGroup(lease_id=f"g{i}", prompt_index=i, prompt_ids=r, version=version, worker_id="honest",
                       rewards=[0.0] * group_size, sampling_seed=seed,
                       completions=[RolloutCompletion(token_ids=c.token_ids, logprobs=c.logprobs) for c in comps])
            for i, (r, seed, comps) in enumerate(zip(rows, seeds, out, strict=True))]


def older_versions(masters, step_size: float, seed: int = 1) -> list[dict[str, torch.Tensor]]:
    """fp32 states of the versions OLDER_VERSIONS..1 steps before `masters`, oldest first, then
    `masters`' own: each step moved every weight by `step_size` in a random sign."""
    generator = torch.Generator().manual_seed(seed)
    current = {k: v.detach().clone() for k, v in unique_tensors(masters).items()}
    states = [current]
    for _ in range(OLDER_VERSIONS):
        states.append({k: v - step_size * torch.randint(0, 2, v.shape, generator=generator).mul(2).sub(1).to(v.dtype)
                       for k, v in states[-1].items()})
    return states[::-1]


def near_tie_flips(masters, payloads, groups: list[TrainGroup], pad_id: int) -> list[float]:
    """At each token that is an older version's seeded choice and not the claimed one's (an
    honest engine's numerics flipping a near-tie), how far it falls short of the claimed
    version's choice: the scale a token must beat to tell versions apart in this engine."""
    found = {"temperature": 1.0, "pad_id": pad_id}
    claimed = groups_sampler_checks(masters, payload_tensors(payloads[-1]), groups, **found)
    out = []
    for payload in payloads[:-1]:
        older = groups_sampler_checks(masters, payload_tensors(payload), groups, **found)
        for mine, theirs in zip(claimed, older, strict=True):
            flipped = (theirs.shortfalls == 0) & (mine.shortfalls > 0)
            out += mine.shortfalls[flipped].tolist()
    return out


def version_fits(engine, engine_name: str, masters, rows, args, grpo, pad_id: int) -> list[dict]:
    """Honest seeded groups claiming the newest of OLDER_VERSIONS + 1 versions, checked against
    the older ones by the learner's audit: per wire dtype and step size, the two rates."""
    out = []
    for step_size in (float(x) for x in args.step_sizes.split(",")):
        states = older_versions(masters, step_size)
        for wire_name, wire in WIRES.items():
            payloads = []
            for state in states:
                masters.load_state_dict(state, strict=False)
                payloads.append(model_payload(masters, wire))
            engine.load_state_dict(payload_tensors(payloads[-1]))
            claimed = len(states) - 1
            groups = groups_from(engine, rows, args.group_size, max(int(n) for n in args.new_tokens.split(",")),
                                 version=claimed, seeded=True)
            auditor = Auditor(AuditConfig(recompute_fraction=1.0, older_versions=OLDER_VERSIONS), max_staleness=2,
                              secret=b"honest", exact_wire=wire == torch.float32)
            for version, payload in enumerate(payloads):
                auditor.published(version, payload)
            auditor.check_before_step(masters, groups, step=claimed, grpo=grpo, temperature=1.0, pad_id=pad_id,
                                      precision=CPU_FP32)
            checks = [c for g in groups for c in auditor.version_checked.get(g.lease_id, [])]
            flips = near_tie_flips(masters, payloads, groups, pad_id)
            claimed_tokens, older_tokens = sum(c.claimed for c in checks), sum(c.older for c in checks)
            measured = [c.logprob_fit for c in checks if c.logprob_fit is not None]
            row = {"engine": engine_name, "wire_dtype": wire_name, "step_size": step_size, "groups": len(groups),
                   "disagreement_tokens": claimed_tokens + older_tokens, "older_choice_tokens": older_tokens,
                   "match_rate": claimed_tokens / (claimed_tokens + older_tokens) if checks and
                   claimed_tokens + older_tokens else None,
                   "logprob_observations": len(measured), "logprob_fits": sum(measured),
                   "logprob_fit_rate": sum(measured) / len(measured) if measured else None,
                   "sampler_violations": sum(auditor.sampler_checked.values()),
                   "version_margin": auditor.cfg.version_margin,
                   # with no margin: every token that is an older version's choice and not the claimed one's
                   "older_choice_tokens_at_margin_0": len(flips),
                   "older_choice_claimed_shortfall": stats(flips) if flips else None}
            print(json.dumps(row), flush=True)
            out.append(row)
        masters.load_state_dict(states[-1], strict=False)
    return out


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
    results, fits = [], []
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
        fits += version_fits(engine, engine_name, masters, rows, args, grpo, tokenizer.pad_token_id)
        if hasattr(engine, "close"):
            engine.close()
    worst = {e: max(r["under_wire_version"]["max"] for r in results if r["engine"] == e)
             for e in sorted({r["engine"] for r in results})}
    out = {"benchmark": "audit_honest_diff", "provenance": provenance(ROOT, sys.argv[1:] if argv is None else argv),
           "settings": {k: v for k, v in vars(args).items() if k != "out"},
           "model": "SmolLM2-135M-Instruct (dequantized Q4_1 GGUF), weights moved ~1e-3 relative",
           "runs": results, "largest_honest_diff_by_engine": worst, "version_fits": fits}
    Path(args.out).write_text(json.dumps(out, indent=2))
    print(json.dumps({"largest_honest_diff_by_engine": worst}))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
