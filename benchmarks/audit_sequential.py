"""The rollout audit's version test across groups (policy.evidence), run by the real learner and
coordinator code on real seeded samples: does a worker that samples with an older version than
it claims get caught, and after how many groups; how many of its groups train, at what true
staleness; and how many groups of honest workers are held out, and are any quarantined?

Versions are real training steps of the tiny model (train_step at --lr, one seeded batch each),
published in each wire dtype from the fp32 masters. A worker samples with the HF engine and the
seeded sampler: float32 wire into an fp32 engine, or bfloat16 wire into an engine computing in
bf16 (as a GPU worker does). At each learner step t the worker submits --groups-per-step groups
claiming version t - lag (lag drawn from 0..S, so honest groups are as stale as S allows); the
liar samples them with version t - lag - lie. Each group gets the audit mode the coordinator's
ledger gives its worker when it is accepted (AuditLedger.audit_mode), the learner's Auditor
checks the step's groups (check_before_step, and check_current with the step's own differences
for groups at the current version on an exact wire), and the ledger weighs the verdicts.
A group trains when it neither failed nor was held out and its worker is not quarantined.
A late liar is honest for --late-after groups first (cleared or proven by then: checked by
chance), then lies: the groups it trains after it turns, and after how many it is caught.

    .venv/bin/python benchmarks/audit_sequential.py            # ~10 min on 2 cores
    .venv/bin/python benchmarks/audit_sequential.py --runs 3 --honest-groups 100 --out /tmp/a.json

Goal (issue 44): no lying group trained beyond S in any run; lies of one version caught within 10
of the liar's groups at the median; no honest worker quarantined and under 1% of honest groups
held out.
"""

from __future__ import annotations

import argparse
import json
import random
import statistics
import sys
import tempfile
import time
from collections import Counter
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "src"))
sys.path.insert(0, str(ROOT / "benchmarks"))

import torch  # noqa: E402
from load.provenance import provenance  # noqa: E402

from echo2.config.audit import AuditConfig  # noqa: E402
from echo2.config.run import GRPOConfig, ModelConfig  # noqa: E402
from echo2.config.worker import WorkerConfig  # noqa: E402
from echo2.coordinator.parts.audit import AuditLedger  # noqa: E402
from echo2.learner.audit import Auditor, recompute_mean_abs_diff  # noqa: E402
from echo2.learner.precision import CPU_FP32  # noqa: E402
from echo2.learner.step import train_step  # noqa: E402
from echo2.models.loading import load_model, load_tokenizer  # noqa: E402
from echo2.models.tiny import save_tiny  # noqa: E402
from echo2.models.weights import model_payload, payload_tensors  # noqa: E402
from echo2.policy.evidence import VersionEvidence  # noqa: E402
from echo2.protocol.learner_api import AuditReport  # noqa: E402
from echo2.protocol.messages import RolloutCompletion, TrainGroup  # noqa: E402
from echo2.rollout.engine import GenRequest  # noqa: E402
from echo2.rollout.engine_factory import make_engine  # noqa: E402

MEASURES = ("src/echo2/learner/audit.py", "src/echo2/learner/version_check.py", "src/echo2/learner/sampler_audit.py",
            "src/echo2/policy/evidence.py", "src/echo2/coordinator/parts/audit.py", "src/echo2/config/audit.py",
            "src/echo2/rollout/hf_engine.py", "benchmarks/audit_sequential.py")
"""The code its results measure (benchmarks/check.py)."""
TINY = ModelConfig(hidden_size=32, num_layers=1, num_heads=2, intermediate_size=64)  # the tests' tiny model
WIRES = {"float32": (torch.float32, "float32"), "bfloat16": (torch.bfloat16, "bfloat16")}


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--wires", default="float32,bfloat16")
    parser.add_argument("--lies", default="1,2,3")
    parser.add_argument("--runs", type=int, default=20, help="seeded liar runs per lie and wire")
    parser.add_argument("--liar-groups", type=int, default=40, help="a liar run stops here if not caught")
    parser.add_argument("--late-runs", type=int, default=10,
                        help="seeded runs per lie and wire of a liar honest for --late-after groups first")
    parser.add_argument("--late-after", type=int, default=40, help="a late liar's honest groups before its lie")
    parser.add_argument("--honest-groups", type=int, default=1000, help="per wire, split among the honest workers")
    parser.add_argument("--honest-workers", default="1,4",
                        help="fleets to try, each sharing --honest-groups (every worker new: unproven at first)")
    parser.add_argument("--versions", type=int, default=24)
    parser.add_argument("--lr", type=float, default=5e-3)
    parser.add_argument("--groups-per-step", type=int, default=2)
    parser.add_argument("--group-size", type=int, default=4)
    parser.add_argument("--new-tokens", type=int, default=8)
    parser.add_argument("--max-staleness", type=int, default=2)
    parser.add_argument("--out", default=str(ROOT / "benchmarks/results/audit_sequential.json"))
    return parser.parse_args(argv)


class Versions:
    """The learner's fp32 masters after each real step, and each version as each wire carries it."""

    def __init__(self, source: str, args: argparse.Namespace) -> None:
        self.model = load_model(source, torch.device("cpu"))
        self.tokenizer = load_tokenizer(source)
        self.grpo = GRPOConfig(prompts_per_step=4, lr=args.lr)
        trainer = make_engine(WorkerConfig(engine="hf", device="cpu", dtype="float32"), source)
        optimizer = torch.optim.AdamW(self.model.parameters(), lr=args.lr)
        self.masters = [self._snapshot()]
        for step in range(args.versions - 1):
            trainer.load_state_dict(payload_tensors(model_payload(self.model)))
            groups = sample(trainer, self.tokenizer, args, version=step, worker_id="trainer", seed=10_000 + step,
                            count=4)
            train_step(self.model, optimizer, groups, step=step, cfg=self.grpo, temperature=1.0,
                       pad_id=self.tokenizer.pad_token_id)
            self.masters.append(self._snapshot())
        self.payloads = {}
        for wire, (dtype, _) in WIRES.items():
            self.payloads[wire] = [self._payload(state, dtype) for state in self.masters]

    def _snapshot(self) -> dict[str, torch.Tensor]:
        return {k: v.detach().clone() for k, v in self.model.state_dict().items()}

    def _payload(self, state: dict[str, torch.Tensor], dtype: torch.dtype):
        self.model.load_state_dict(state)
        return model_payload(self.model, dtype)

    def at(self, version: int) -> torch.nn.Module:
        """The learner's model holding version `version`'s masters."""
        self.model.load_state_dict(self.masters[version])
        return self.model


def sample(engine, tokenizer, args, *, version: int, worker_id: str, seed: int, count: int,
           audit: str = "by_chance") -> list[TrainGroup]:
    """`count` groups drawn by `engine` with the seeded sampler, claiming `version`."""
    rng = random.Random(seed)
    prompts = [tokenizer.encode(f"{rng.randrange(10)}+{rng.randrange(10)}=", add_special_tokens=False)
               for _ in range(count)]
    seeds = [rng.randrange(1 << 31) for _ in range(count)]
    out = engine.generate([GenRequest(p, args.group_size, 1.0, args.new_tokens, seed=s)
                           for p, s in zip(prompts, seeds, strict=True)])
    return [TrainGroup(lease_id=f"{worker_id}-{seed}-{i}", prompt_index=i, prompt_ids=p, version=version,
                       worker_id=worker_id, rewards=[float(k % 2) for k in range(args.group_size)],
                       sampling_seed=s, audit=audit,
                       completions=[RolloutCompletion(token_ids=c.token_ids, logprobs=c.logprobs) for c in comps])
            for i, (p, s, comps) in enumerate(zip(prompts, seeds, out, strict=True))]


class Fleet:
    """One wire's worker engine, learner audit and coordinator ledger."""

    def __init__(self, versions: Versions, wire: str, source: str, args: argparse.Namespace) -> None:
        self.versions, self.wire, self.args = versions, wire, args
        self.engine = make_engine(WorkerConfig(engine="hf", device="cpu", dtype=WIRES[wire][1]), source)
        self.cfg = AuditConfig()
        self.exact_wire = wire == "float32"  # the masters are fp32
        self.logprob_fits: dict[int, Counter] = {}  # offset -> {fits: groups}, since `reset_fits`
        self.reset_fits()

    def reset_fits(self) -> None:
        self.logprob_fits = {k: Counter() for k in range(1, self.cfg.older_versions + 1)}

    def ledger(self) -> AuditLedger:
        c = self.cfg
        return AuditLedger(c.flags_to_quarantine, evidence=VersionEvidence(
            c.older_versions, c.honest_match_rate, c.false_positive_rate, c.honest_logprob_fit_rate),
            proven_groups=c.proven_groups)

    def step(self, ledger: AuditLedger, worker_id: str, *, step: int, lie: int,
             seed: int) -> list[tuple[TrainGroup, int, bool]]:
        """One learner step's groups from the worker; returns those that trained, each with its
        true staleness (the version that sampled it, not the one it claims) and whether any of
        its tokens is not the claimed version's choice (`_told_apart`)."""
        rng = random.Random(seed)
        groups, sampled_by = [], {}
        for index in range(self.args.groups_per_step):
            claimed = step - rng.randint(0, self.args.max_staleness)
            sampled = claimed - lie
            self.engine.load_state_dict(payload_tensors(self.versions.payloads[self.wire][sampled]))
            group, = sample(self.engine, self.versions.tokenizer, self.args, version=claimed, worker_id=worker_id,
                            seed=seed * 16 + index, count=1, audit=ledger.audit_mode(worker_id))
            groups.append(group)
            sampled_by[group.lease_id] = sampled
        verdicts = self._audit(groups, step)
        rejected = {v.lease_id for v in verdicts if v.failed or v.held_out}
        current = [g for g in groups if g.version == step and g.lease_id not in rejected]
        if current and self.exact_wire:  # the step's own check of its current-version groups
            diffs = recompute_mean_abs_diff(self.versions.at(step), payload_tensors(
                self.versions.payloads[self.wire][step]), current, grpo=self.versions.grpo, temperature=1.0, pad_id=0)
            in_step = self.auditor.check_current(current, step, diffs)
            verdicts += in_step
            rejected |= {v.lease_id for v in in_step if v.failed}
        ledger.record(AuditReport(step=step, groups=verdicts))
        for verdict in {v.lease_id: v for v in verdicts}.values():  # the log-prob side's observations
            for check in verdict.version_checks:
                if check.logprob_fit is not None:
                    self.logprob_fits[check.offset][check.logprob_fit] += 1
        if worker_id in ledger.quarantined:
            return []
        checks = {v.lease_id: v.version_checks for v in verdicts}
        trained = [g for g in groups if g.lease_id not in rejected]
        return [(g, step - sampled_by[g.lease_id], _told_apart(checks.get(g.lease_id), lie))
                for g in trained]

    def _audit(self, groups: list[TrainGroup], step: int):
        self.auditor = Auditor(self.cfg, self.args.max_staleness, secret=b"bench", exact_wire=self.exact_wire)
        first = max(0, step - self.auditor.cache.capacity + 1)
        for version in range(first, step + 1):
            self.auditor.published(version, self.versions.payloads[self.wire][version])
        return self.auditor.check_before_step(self.versions.at(step), groups, step=step, grpo=self.versions.grpo,
                                              temperature=1.0, pad_id=0, precision=CPU_FP32)

    def steps(self, lie: int):
        """Learner steps at which every claim (down to S + lie versions back) exists, cycled."""
        first = self.args.max_staleness + lie
        while True:
            yield from range(first, len(self.versions.masters))


def _told_apart(checks, lie: int) -> bool:
    """Whether the audit saw a token of the group that the version it was sampled with chose and
    the claimed one did not (a lie of 0 versions: never). Unchecked at that offset: assumed so."""
    if lie == 0:
        return False
    found = next((c for c in checks or [] if c.offset == lie), None)
    return found is None or found.older > 0


def liar_run(fleet: Fleet, lie: int, run: int, honest_groups: int = 0) -> dict:
    """A liar's run: `honest_groups` groups sampled with the claimed version first (a worker
    that turns after earning standing), then every group `lie` versions older than claimed."""
    ledger, steps = fleet.ledger(), fleet.steps(lie)
    submitted, trained, told_apart, caught_after, mode_at_turn = 0, [], [], None, None
    while submitted < honest_groups + fleet.args.liar_groups:
        step = next(steps)
        lying = submitted >= honest_groups
        if lying and mode_at_turn is None:
            mode_at_turn = ledger.audit_mode("liar")
        base = 1_000_000 * lie + 1000 * run + 100_000_000 * (honest_groups > 0)
        for _, staleness, differs in fleet.step(ledger, "liar", step=step, lie=lie if lying else 0,
                                                seed=base + submitted):
            if lying:
                trained.append(staleness)
                told_apart.append(differs)
        submitted += fleet.args.groups_per_step
        if "liar" in ledger.quarantined:
            caught_after = submitted - honest_groups if lying else None
            break
    return {"run": run, "caught_after_groups": caught_after, "trained_staleness": trained,
            "trained_beyond_s_told_apart": sum(d and s > fleet.args.max_staleness for s, d in zip(trained, told_apart,
                                                                                                  strict=True)),
            "held_out": ledger.workers["liar"].held_out if "liar" in ledger.workers else 0,
            "audit_mode_when_it_turned": mode_at_turn if honest_groups else None,
            "quarantined_while_honest": "liar" in ledger.quarantined and caught_after is None,
            "reason": ledger.quarantined.get("liar")}


def honest_run(fleet: Fleet, index: int, groups: int) -> dict:
    """One honest worker's `groups`, from its first (unproven) group on."""
    worker_id = f"honest{index}"
    ledger, steps = fleet.ledger(), fleet.steps(0)
    submitted, trained, held_unproven = 0, 0, 0
    fleet.reset_fits()
    while submitted < groups:
        unproven = ledger.audit_mode(worker_id) == "unproven"
        before = ledger.workers[worker_id].held_out if worker_id in ledger.workers else 0
        seed = 5_000_000 + 100_000 * index + submitted
        trained += len(fleet.step(ledger, worker_id, step=next(steps), lie=0, seed=seed))
        held_unproven += (ledger.workers[worker_id].held_out - before) if unproven else 0
        submitted += fleet.args.groups_per_step
        if worker_id in ledger.quarantined:
            break
    stats = ledger.workers[worker_id]
    return {"worker": worker_id, "groups": submitted, "trained": trained, "held_out": stats.held_out,
            "held_out_while_unproven": held_unproven, "failed": stats.failed,
            "quarantined": worker_id in ledger.quarantined, "reason": ledger.quarantined.get(worker_id),
            "evidence_nats_end": round(stats.version_evidence_nats, 2),
            "logprob_fits": {k: dict(v) for k, v in fleet.logprob_fits.items()}}


def honest_fleet(fleet: Fleet, workers: int, groups: int) -> dict:
    runs = [honest_run(fleet, i, groups // workers) for i in range(workers)]
    submitted = sum(w["groups"] for w in runs)
    held = sum(w["held_out"] for w in runs)
    observed = sum(n for w in runs for by_fit in w["logprob_fits"].values() for n in by_fit.values())
    fits = sum(by_fit.get(True, 0) for w in runs for by_fit in w["logprob_fits"].values())
    return {"workers": workers, "groups": submitted, "held_out": held, "held_out_rate": held / submitted,
            # the honest log-prob distribution's one number the test models (audit.honest_logprob_fit_rate)
            "logprob_observations": observed, "logprob_fits": fits,
            "logprob_fit_rate": fits / observed if observed else None,
            "held_out_while_unproven": sum(w["held_out_while_unproven"] for w in runs),
            "quarantined": sum(w["quarantined"] for w in runs), "per_worker": runs}


def summarize_lie(lie: int, runs: list[dict], max_staleness: int) -> dict:
    caught = [r["caught_after_groups"] for r in runs if r["caught_after_groups"] is not None]
    trained = [s for r in runs for s in r["trained_staleness"]]
    return {"lie_versions": lie, "runs": len(runs), "caught": len(caught),
            "caught_after_groups": {"min": min(caught, default=None), "median": statistics.median(caught) if caught
                                    else None, "max": max(caught, default=None), "all": sorted(caught)},
            "groups_trained": len(trained), "trained_staleness_hist": dict(sorted(Counter(trained).items())),
            "groups_trained_beyond_s": sum(s > max_staleness for s in trained),
            # of those, groups with a token that is not the claimed version's choice: the rest are,
            # token for token, what an honest worker holding the claimed version returns
            "groups_trained_beyond_s_with_a_token_not_the_claimed_versions_choice": sum(
                r["trained_beyond_s_told_apart"] for r in runs),
            "runs_with_a_group_trained_beyond_s": sum(any(s > max_staleness for s in r["trained_staleness"])
                                                      for r in runs),
            "held_out": sum(r["held_out"] for r in runs), "per_run": runs}


def run_wire(wire: str, versions: Versions, source: str, args: argparse.Namespace) -> dict:
    fleet = Fleet(versions, wire, source, args)
    started = time.perf_counter()
    lies = []
    for lie in map(int, args.lies.split(",")):
        lies.append(summarize_lie(lie, [liar_run(fleet, lie, run) for run in range(args.runs)], args.max_staleness))
        _progress(wire, f"lie {lie}", lies[-1], started)
    late = []
    for lie in map(int, args.lies.split(",")) if args.late_runs else ():
        runs = [liar_run(fleet, lie, run, honest_groups=args.late_after) for run in range(args.late_runs)]
        late.append({**summarize_lie(lie, runs, args.max_staleness), "honest_groups_first": args.late_after,
                     "audit_mode_when_it_turned": dict(Counter(r["audit_mode_when_it_turned"] for r in runs)),
                     "quarantined_while_honest": sum(r["quarantined_while_honest"] for r in runs)})
        _progress(wire, f"late lie {lie}", late[-1], started)
    honest = []
    for workers in map(int, args.honest_workers.split(",")):
        honest.append(honest_fleet(fleet, workers, args.honest_groups))
        print(f"[audit_sequential] {wire} honest x{workers}: held out {honest[-1]['held_out']}/{honest[-1]['groups']}"
              f", quarantined {honest[-1]['quarantined']} ({time.perf_counter() - started:.0f} s)", file=sys.stderr,
              flush=True)
    return {"wire": wire, "engine": f"hf computing in {WIRES[wire][1]}", "liars": lies, "late_liars": late,
            "honest": honest,
            "seconds": round(time.perf_counter() - started, 1)}


def _progress(wire: str, what: str, result: dict, started: float) -> None:
    print(f"[audit_sequential] {wire} {what}: caught {result['caught']}/{result['runs']}, median after "
          f"{result['caught_after_groups']['median']} groups, beyond S trained {result['groups_trained_beyond_s']}"
          f" ({time.perf_counter() - started:.0f} s)", file=sys.stderr, flush=True)


def goals(wires: list[dict], max_staleness: int) -> dict:
    lies = [lie for w in wires for lie in w["liars"]]
    ones = [lie for lie in lies if lie["lie_versions"] == 1]
    return {
        "no_lying_group_trained_beyond_s": all(lie["groups_trained_beyond_s"] == 0 for lie in lies),
        "no_lying_group_trained_beyond_s_with_a_token_not_the_claimed_versions_choice": all(
            lie["groups_trained_beyond_s_with_a_token_not_the_claimed_versions_choice"] == 0 for lie in lies),
        "one_version_lie_caught_within_10_groups_at_median": all(
            lie["caught_after_groups"]["median"] is not None and lie["caught_after_groups"]["median"] <= 10
            and lie["caught"] == lie["runs"] for lie in ones),
        "no_honest_worker_quarantined": all(h["quarantined"] == 0 for w in wires for h in w["honest"]),
        "honest_held_out_under_1_percent": all(h["held_out_rate"] < 0.01 for w in wires for h in w["honest"]),
        "max_staleness": max_staleness,
    }


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    torch.manual_seed(0)
    with tempfile.TemporaryDirectory() as tmp:
        save_tiny(TINY, Path(tmp), seed=0)
        versions = Versions(tmp, args)
        wires = [run_wire(wire, versions, tmp, args) for wire in args.wires.split(",")]
    audit = AuditConfig()
    out = {"benchmark": "audit_sequential", "provenance": provenance(ROOT, sys.argv[1:] if argv is None else argv),
           "settings": {**{k: v for k, v in vars(args).items() if k != "out"},
                        "model": "the tiny model (1-layer Qwen3), versions one real train_step apart",
                        "audit": audit.model_dump()},
           "wires": wires, "goals": goals(wires, args.max_staleness)}
    Path(args.out).write_text(json.dumps(out, indent=1))
    print(json.dumps(out["goals"]))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
