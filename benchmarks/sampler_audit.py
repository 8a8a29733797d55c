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
wants its answers right returns) with their true log-probs, which pass the log-prob audit. K,
the groups it submits before quarantine, is measured through the real audit path, --k-runs
seeded runs each: its groups go one at a time through the coordinator's AuditLedger (which says
how each is to be audited) and the learner's Auditor (which picks by its keyed hash, each run
its own key, and checks), and the ledger weighs the verdicts. Two choosers: a new one (its groups
checked until it is proven) and a late one that turns after --late-after honest groups (proven,
so checked by chance at audit.recompute_fraction).

    .venv/bin/python benchmarks/sampler_audit.py --groups 500
    .venv-vllm/bin/python benchmarks/sampler_audit.py --engines vllm-fp32,vllm-bf16 --groups 1000

Results go to benchmarks/results/sampler_audit[_tiny][_vllm].json (_vllm when a vLLM engine ran).
"""

from __future__ import annotations

import argparse
import copy
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "src"))
sys.path.insert(0, str(ROOT / "benchmarks"))

import torch  # noqa: E402
from audit_honest_diff import engine_for, prompts, trained_like  # noqa: E402
from load.provenance import provenance  # noqa: E402

from echo2.config.audit import AuditConfig  # noqa: E402
from echo2.config.run import GRPOConfig  # noqa: E402
from echo2.coordinator.parts.audit import AuditLedger  # noqa: E402
from echo2.learner.audit import Auditor  # noqa: E402
from echo2.learner.precision import CPU_FP32  # noqa: E402
from echo2.learner.sampler_audit import groups_shortfalls  # noqa: E402
from echo2.models.embedded import fetch  # noqa: E402
from echo2.models.loading import load_model, load_tokenizer  # noqa: E402
from echo2.models.weights import model_payload, payload_tensors  # noqa: E402
from echo2.policy.evidence import VersionEvidence  # noqa: E402
from echo2.protocol.learner_api import AuditReport  # noqa: E402
from echo2.protocol.messages import RolloutCompletion, TrainGroup  # noqa: E402
from echo2.rollout.engine import GenRequest  # noqa: E402

MEASURES = ("src/echo2/learner/audit.py", "src/echo2/learner/sampler_audit.py", "src/echo2/learner/version_check.py",
            "src/echo2/policy/evidence.py", "src/echo2/coordinator/parts/audit.py", "src/echo2/config/audit.py",
            "src/echo2/rollout/hf_engine.py", "src/echo2/rollout/vllm_engine.py", "benchmarks/sampler_audit.py",
            "benchmarks/audit_honest_diff.py")
"""The code its results measure (benchmarks/check.py)."""
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
    parser.add_argument("--side-by-side", action="store_true",
                        help="each engine in its own one-thread process at once, one result file")
    parser.add_argument("--k-runs", type=int, default=20, help="seeded runs of the audit path per chooser")
    parser.add_argument("--k-max-groups", type=int, default=40, help="a chooser run stops here if not caught")
    parser.add_argument("--late-after", type=int, default=None,
                        help="honest groups before the late chooser turns (default: audit.proven_groups)")
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


@torch.no_grad()
def true_logprobs(model, prompt: list[int], completions: list[list[int]]) -> list[list[float]]:
    """What the worker's engine gives each token at temperature 1: the chooser hides nothing the
    log-prob audit could see."""
    out = []
    for tokens in completions:
        logits = model(torch.tensor([prompt + tokens])).logits[0, len(prompt) - 1:-1].float()
        out.append(torch.log_softmax(logits, -1).gather(-1, torch.tensor(tokens)[:, None]).squeeze(-1).tolist())
    return out


class AuditPath:
    """The coordinator's ledger and the learner's auditor, one worker "w" claiming version 1 at
    learner step 2 (one version stale: recomputed under the payload it was sent, on every wire)."""

    CLAIMED, STEP = 1, 2

    def __init__(self, masters, payload, grpo, pad_id: int, exact_wire: bool) -> None:
        self.masters, self.payload, self.grpo, self.pad_id, self.exact_wire = masters, payload, grpo, pad_id, exact_wire
        cfg = self.cfg = AuditConfig()
        self.ledger = AuditLedger(cfg.flags_to_quarantine, evidence=VersionEvidence(
            cfg.older_versions, cfg.honest_match_rate, cfg.false_positive_rate, cfg.honest_logprob_fit_rate),
            proven_groups=cfg.proven_groups)
        self.keyed(b"honest")

    def keyed(self, secret: bytes) -> None:
        """A learner with its own audit key (each seeded run's groups are picked differently)."""
        self.auditor = Auditor(self.cfg, max_staleness=2, secret=secret, exact_wire=self.exact_wire)
        for version in (self.CLAIMED, self.STEP):
            self.auditor.published(version, self.payload)

    def fork(self) -> AuditPath:
        """The same worker's record so far, for one seeded run."""
        forked = copy.copy(self)
        forked.ledger = copy.deepcopy(self.ledger)
        return forked

    def submit(self, group: TrainGroup, lease_id: str) -> bool:
        """One group through the audit; whether its worker is quarantined after it."""
        group = group.model_copy(update={"worker_id": "w", "lease_id": lease_id, "version": self.CLAIMED,
                                         "audit": self.ledger.audit_mode("w")})
        verdicts = self.auditor.check_before_step(self.masters, [group], step=self.STEP, grpo=self.grpo,
                                                  temperature=1.0, pad_id=self.pad_id, precision=CPU_FP32)
        self.ledger.record(AuditReport(step=self.STEP, groups=verdicts))
        return "w" in self.ledger.quarantined


def chooser_k(engine, path: AuditPath, rows, args, run: int) -> int | None:
    """Groups the chooser submits until quarantine (None: not caught within --k-max-groups)."""
    path.keyed(f"run-{run}".encode())
    for n in range(args.k_max_groups):
        row, seed = rows[n % len(rows)], 10_000_000 + 1000 * run + n
        group, = chosen_groups(engine, [row], args, seed)
        logprobs = true_logprobs(engine.model, row, [c.token_ids for c in group.completions])
        group = group.model_copy(update={"completions": [
            RolloutCompletion(token_ids=c.token_ids, logprobs=lp) for c, lp in zip(group.completions, logprobs,
                                                                                    strict=True)]})
        if path.submit(group, f"run{run}-c{n}"):
            return n + 1
    return None


def k_distribution(values: list[int | None]) -> dict:
    caught = sorted(v for v in values if v is not None)
    return {"runs": len(values), "caught": len(caught), "k": values,
            "median": statistics.median(caught) if caught else None, "max": max(caught, default=None),
            "histogram": {str(k): caught.count(k) for k in sorted(set(caught))}}


def measured_k(engine, masters, payload, rows, args, pad_id: int, exact_wire: bool) -> dict:
    """K over --k-runs seeded runs, for a new chooser and for one that turns once proven."""
    grpo = GRPOConfig()
    fresh = AuditPath(masters, payload, grpo, pad_id, exact_wire)
    proven = AuditPath(masters, payload, grpo, pad_id, exact_wire)
    late_after = args.late_after if args.late_after is not None else proven.cfg.proven_groups
    first = honest_groups(engine, [rows[i % len(rows)] for i in range(late_after)], args, 20_000_000)
    for n, group in enumerate(first):
        proven.submit(group, f"honest-{n}")
    mode_at_turn = proven.ledger.audit_mode("w")
    new = [chooser_k(engine, fresh.fork(), rows, args, run) for run in range(args.k_runs)]
    late = [chooser_k(engine, proven.fork(), rows, args, run) for run in range(args.k_runs)]
    return {"new_chooser": k_distribution(new),
            "late_chooser": {**k_distribution(late), "honest_groups_first": late_after,
                             "audit_mode_when_it_turned": mode_at_turn,
                             "quarantined_while_honest": "w" in proven.ledger.quarantined}}


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
    k = measured_k(engine, masters, payload, rows, args, pad_id, exact_wire=wire is torch.float32)
    return {"engine": name, "wire_dtype": wire_name, "honest_groups": len(worst), "honest_groups_wanted": wanted,
            "chosen_groups": len(chooser),
            "tokens_per_group_max": args.group_size * args.new_tokens,
            "honest_false_positive_rate": {str(m): flagged_share(worst, m) for m in MARGINS},
            "honest_largest_shortfall": max(worst),
            "chooser_flagged_share": {str(m): flagged_share(chooser, m) for m in MARGINS},
            "chooser_groups_until_quarantine_measured": k,
            "honest_seconds_per_group": round(honest_s / len(worst), 3),
            "seconds": round(time.perf_counter() - started, 1)}


def model_source(args) -> tuple[str, list[list[int]] | None]:
    """The model's directory, and the tiny model's prompts (SmolLM2's come from its chat template)."""
    if args.model == "smollm2":
        return str(fetch("smollm2-135m-instruct", str(ROOT / "runs/.cache"), log=lambda line: None).hf_dir), None

    from echo2.config.run import ModelConfig
    from echo2.models.tiny import save_tiny

    out = Path(tempfile.mkdtemp(prefix="sampler-audit-"))
    save_tiny(ModelConfig(hidden_size=32, num_layers=1, num_heads=2, intermediate_size=64), out, seed=0)
    tokenizer = load_tokenizer(str(out))
    rows = [tokenizer.encode(f"{a}+{b}=", add_special_tokens=False) for a in range(4) for b in range(4)]
    return str(out), rows[: args.prompts]


def side_by_side(engines: list[str], argv: list[str]) -> list[dict]:
    """Each engine in its own one-thread process at once (2 engines on 2 cores: half the time);
    their rows, in the order given."""
    import os
    import subprocess

    rest = [a for a in argv if a != "--side-by-side"]
    rest = [a for i, a in enumerate(rest) if a != "--engines" and (i == 0 or rest[i - 1] != "--engines")]
    outs = {name: Path(tempfile.mkdtemp(prefix="sampler-audit-")) / f"{name}.json" for name in engines}
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    children = [subprocess.Popen([sys.executable, __file__, *rest, "--engines", name, "--out", str(outs[name])],
                                 env=env) for name in engines]
    failed = [name for name, child in zip(engines, children, strict=True) if child.wait() != 0]
    if failed:
        raise SystemExit(f"sampler_audit: the {', '.join(failed)} process failed (its output is above)")
    return [json.loads(outs[name].read_text())["runs"][0] for name in engines]


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    torch.manual_seed(0)
    source, rows = model_source(args)
    masters, tokenizer = load_model(source), load_tokenizer(source)
    trained_like(masters)
    rows = rows or prompts(tokenizer, args.prompts)
    if args.side_by_side and "," in args.engines:
        results = side_by_side(args.engines.split(","), sys.argv[1:] if argv is None else argv)
    else:
        results = [run_config(name, source=source, masters=masters, rows=rows, args=args,
                              pad_id=tokenizer.pad_token_id) for name in args.engines.split(",")]
    for row in results:
        print(json.dumps(row), flush=True)
    audit = AuditConfig()
    model = ("SmolLM2-135M-Instruct (dequantized Q4_1 GGUF)" if args.model == "smollm2" else
             "the tiny character model (untrained, 1-layer Qwen3)")
    out = {"benchmark": "sampler_audit", "provenance": provenance(ROOT, sys.argv[1:] if argv is None else argv),
           "model": model + ", weights moved ~1e-3 relative", "new_tokens": args.new_tokens,
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
