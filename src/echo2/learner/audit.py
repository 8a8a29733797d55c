"""The rollout audit: were a group's tokens sampled from the version its worker claims?

An honest worker's behaviour log-probs are the claimed version's own log-probs of the tokens it
sampled, up to engine numerics, and the version is what the worker was sent: the published
payload in the wire dtype. Where that equals the learner's own weights (an fp32 wire from fp32
masters) the learner's log-probs of the step are the version's, so groups generated at the
current version are checked for free. Every other group is compared with the wire version
itself: a share of them (`audit.recompute_fraction`, chosen by a keyed hash the worker cannot
predict) is recomputed under its version's published payload, kept in a small CPU cache of
recent versions. With a bf16 wire and fp32 masters, comparing with the masters instead would
charge honest workers the bf16 rounding, orders of magnitude more than the engine numerics that
remain under the wire version. A group whose mean |difference| per token exceeds
`audit.max_mean_abs_logprob_diff` fails: fabricated log-probs, tokens from another model or
version, or tokens edited after sampling all show up there. A worker that draws with the seeded
sampler (every HF or vLLM worker) has the chosen groups' tokens checked too
(`sampler_audit.py`): each must be the token its lease's seed picks under the claimed version,
so choosing tokens and reporting their true log-probs fails (in a multi-turn episode, each of
the model's actions; the environment's answers are replayed by the coordinator instead). What
the audit cannot see: a worker that samples honestly from the right version and then chooses
which groups to return (it still never chooses the rewards, which the coordinator computes), and
tokens of free-sampling workers (a run with audit.require_seeded_sampler off) beyond their
log-probs.
"""

from __future__ import annotations

import hashlib
import hmac
import mmap
from collections import OrderedDict

import torch
from torch.func import functional_call

from echo2.config.audit import AuditConfig
from echo2.config.run import GRPOConfig
from echo2.learner.batching import Samples, flatten
from echo2.learner.logprobs import token_logprobs
from echo2.learner.passes import build_pass, choose_layout, plan_passes
from echo2.learner.precision import CPU_FP32, Precision
from echo2.learner.sampler_audit import groups_sampler_checks, violations
from echo2.learner.version_check import (
    LOGPROB_FIT_FLOOR,
    LOGPROB_FIT_RATIO,
    fits,
    may_be_staler,
    merge,
    staler_versions,
    version_checks,
    with_logprob_fits,
)
from echo2.models.weights import payload_tensors
from echo2.protocol.learner_api import GroupAudit, VersionCheck
from echo2.protocol.messages import TrainGroup
from echo2.protocol.token_versions import tokens_by_version


class VersionCache:
    """The newest `capacity` versions exactly as workers received them: the published payloads
    (wire dtype, CPU), shared with the origin while it still serves them, so caching costs no
    copy and no memory for versions the origin keeps anyway."""

    def __init__(self, capacity: int) -> None:
        self.capacity = capacity
        self.payloads: OrderedDict[int, bytes | mmap.mmap] = OrderedDict()

    def add(self, version: int, payload: bytes | mmap.mmap) -> None:
        if self.capacity <= 0:
            return
        self.payloads[version] = payload
        self.payloads.move_to_end(version)
        while len(self.payloads) > self.capacity:
            self.payloads.popitem(last=False)

    def get(self, version: int) -> dict[str, torch.Tensor] | None:
        """The version's tensors, viewing the payload in place (tied aliases appear once;
        functional_call ties them again)."""
        payload = self.payloads.get(version)
        return payload_tensors(payload) if payload is not None else None


def audit_key(secret: bytes) -> bytes:
    """The key that picks which stale groups are recomputed, derived from a learner secret so a
    resumed learner picks the same ones and no worker can tell which of its groups will be."""
    return hashlib.sha256(b"echo2 rollout audit\0" + secret).digest()


def chosen(key: bytes, lease_id: str, fraction: float) -> bool:
    if fraction >= 1.0:
        return True
    digest = hmac.new(key, lease_id.encode(), hashlib.sha256).digest()
    return int.from_bytes(digest[:8], "big") < fraction * 2.0**64


def sampled_versions(group: TrainGroup) -> list[int]:
    """The versions that sampled a group's model tokens (its own when it has none)."""
    counts = tokens_by_version(group.completions, group.version)
    return sorted(v for v, n in counts.items() if n) or [group.version]


def group_mean_abs_diff(samples: Samples, abs_diff_sum_S: torch.Tensor, num_groups: int) -> list[float]:
    """Per group: sum over its samples' trained tokens of |learner - behaviour| / their count
    (an environment's tokens have no behaviour log-prob to check)."""
    sums, tokens = [0.0] * num_groups, [0] * num_groups
    for index, group in enumerate(samples.group_ids):
        sums[group] += float(abs_diff_sum_S[index])
        tokens[group] += samples.trained_tokens(index)
    return [s / t if t else 0.0 for s, t in zip(sums, tokens, strict=True)]


class _Scored(torch.nn.Module):
    """token_logprobs as a module's forward, so functional_call can run it under other weights."""

    def __init__(self, model: torch.nn.Module, temperature: float, chunk_tokens: int) -> None:
        super().__init__()
        self.model, self.temperature, self.chunk_tokens = model, temperature, chunk_tokens

    def forward(self, mb):
        return token_logprobs(self.model, mb, self.temperature, self.chunk_tokens)[0]


def recompute_mean_abs_diff(model: torch.nn.Module, state: dict[str, torch.Tensor], groups: list[TrainGroup],
                            *, grpo: GRPOConfig, temperature: float, pad_id: int,
                            precision: Precision = CPU_FP32, version: int | None = None) -> list[float]:
    """Each group's mean |log-prob under `state` - behaviour log-prob| per token, without
    touching the model's own weights (no gradients, the step's micro-batch budget). `version`:
    only the tokens that version sampled (`state` is its weights; None: every token)."""
    sums, tokens = recompute_abs_diff(model, state, groups, grpo=grpo, temperature=temperature, pad_id=pad_id,
                                      precision=precision, version=version)
    return [s / t if t else 0.0 for s, t in zip(sums, tokens, strict=True)]


def recompute_abs_diff(model: torch.nn.Module, state: dict[str, torch.Tensor], groups: list[TrainGroup],
                       *, grpo: GRPOConfig, temperature: float, pad_id: int, precision: Precision = CPU_FP32,
                       version: int | None = None) -> tuple[list[float], list[int]]:
    """Per group, the sum of |log-prob under `state` - behaviour log-prob| over the tokens
    checked, and how many were checked (`recompute_mean_abs_diff`)."""
    samples = flatten(groups) if version is None else flatten(groups).sampled_by(version)
    device = precision.device
    dtype = next(model.parameters()).dtype
    params = {f"model.{name}": t.to(device, dtype) for name, t in state.items()}
    scored = _Scored(model, temperature, grpo.logprob_chunk_tokens)
    abs_diff_S = torch.zeros(len(samples))
    layout = choose_layout(model, grpo.share_prompts)
    plan = plan_passes(samples, grpo.micro_batch_tokens, layout)
    was_training = model.training
    model.eval()
    try:
        with torch.no_grad(), precision.autocast():
            for indices in plan:
                mb = build_pass(samples, indices, pad_id, layout).to(device)
                logp_N = functional_call(scored, params, (mb,))
                behav_N = torch.tensor([x for i in indices for x in samples.behaviour_logprobs[i]], device=device)
                mask_N = torch.tensor([x for i in indices for x in samples.loss_masks[i]], device=device)
                abs_diff_S.index_add_(0, mb.sample_N.cpu(), ((logp_N.float() - behav_N).abs() * mask_N).cpu())
    finally:
        model.train(was_training)
    sums, tokens = [0.0] * len(groups), [0] * len(groups)
    for index, group in enumerate(samples.group_ids):
        sums[group] += float(abs_diff_S[index])
        tokens[group] += samples.trained_tokens(index)
    return sums, tokens


class Auditor:
    """The learner's side of the audit: which groups to check, the version cache, the verdicts."""

    def __init__(self, cfg: AuditConfig, max_staleness: int, secret: bytes, exact_wire: bool = True) -> None:
        """`exact_wire`: published versions hold the learner's weights exactly (wire dtype =
        the masters' dtype), so the step's own log-probs check the current version's groups."""
        self.cfg = cfg
        self.exact_wire = exact_wire
        self.max_staleness = max_staleness
        self.step = 0  # the step being checked
        # this step's groups whose log-probs fit a version staler than S (`_fit_staler`)
        self.staler_fit: set[str] = set()
        self.key = audit_key(secret)
        # the current version, every admissible older one (a group trained at step t may be from
        # version t - S) and the ones its tokens are compared with (audit.older_versions)
        capacity = max_staleness + 1 + cfg.older_versions if cfg.cached_versions is None else cfg.cached_versions
        self.cache = VersionCache(capacity if cfg.enabled else 0)
        # this step's sampler checks: lease id -> tokens short of the seeded sampler's choice
        self.sampler_checked: dict[str, int] = {}
        # and the same tokens against older versions (learner.version_check)
        self.version_checked: dict[str, list[VersionCheck]] = {}

    @property
    def tolerance(self) -> float | None:
        """What train_step checks groups at the current version against (None: they are not
        checked there: no audit, or a wire version the step's weights are not)."""
        return self.cfg.max_mean_abs_logprob_diff if self.cfg.enabled and self.exact_wire else None

    def published(self, version: int, payload: bytes | mmap.mmap) -> None:
        self.cache.add(version, payload)

    def needs_recompute(self, group: TrainGroup, step: int) -> bool:
        """Groups the step's own log-probs cannot vouch for: older versions, and the current
        one's when the wire is not the learner's weights."""
        return group.version < step or not self.exact_wire

    def check_before_step(self, model: torch.nn.Module, groups: list[TrainGroup], *, step: int,
                          grpo: GRPOConfig, temperature: float, pad_id: int,
                          precision: Precision) -> list[GroupAudit]:
        """Recompute the chosen groups under the versions their workers were sent (before
        training: a failure skips the step before anything is applied)."""
        if not self.cfg.enabled:
            return []
        self.step, self.sampler_checked, self.version_checked = step, {}, {}
        by_version: dict[int, list[TrainGroup]] = {}
        current: list[TrainGroup] = []  # its log-probs are checked inside the step, its sampler here
        for group in groups:
            if group.audit == "by_chance" and not chosen(self.key, group.lease_id, self.cfg.recompute_fraction):
                continue
            if self.needs_recompute(group, step):
                # a generation that straddled versions: each segment under its own version
                for version in sampled_versions(group):
                    if version in self.cache.payloads:
                        by_version.setdefault(version, []).append(group)
            elif group.sampling_seed is not None:
                current.append(group)
        check = {"grpo": grpo, "temperature": temperature, "pad_id": pad_id, "precision": precision}
        self._check_sampler(model, None, current, claimed=step, **check)
        totals = self._recompute(model, by_version, check)
        # the claimed version's differences just measured are not measured again
        known = {lease_id: total / count for lease_id, (_, total, count) in totals.items() if count}
        # a seeded group's log-probs were compared with older versions' in its sampler check
        unseeded = [g for g, _, _ in totals.values() if g.sampling_seed is None]
        self.staler_fit = self._fit_staler(model, unseeded, check, known)
        # a sampler violation or a hold-out at the current version is known before the step
        verdicts = [v for v in (self._verdict(g, 0.0, recomputed=False) for g in current) if v.failed or v.held_out]
        verdicts += [self._verdict(g, total / count if count else 0.0, recomputed=True)
                     for g, total, count in totals.values()]
        # held out although nothing could check it (a free-sampling worker, a version not cached)
        seen = {v.lease_id for v in verdicts}
        verdicts += [self._verdict(g, 0.0, recomputed=False) for g in groups
                     if g.audit == "hold_out" and g.lease_id not in seen]
        return verdicts + companions(groups, verdicts)

    def _fit_staler(self, model: torch.nn.Module, groups: list[TrainGroup], check: dict,
                    known: dict[str, float]) -> set[str]:
        """Lease ids of checked groups whose behaviour log-probs are closer to a version that
        would make them staler than S than to the claimed one (LOGPROB_FIT_RATIO): a worker
        sampling with that version reports its log-probs, up to its engine's numerics, even where
        every token is also the claimed version's choice. Groups sampled by one version only,
        without a seed (a seeded group's sampler check compares its log-probs); `known`: their
        differences from the claimed version where already measured."""
        by_older: dict[int, list[TrainGroup]] = {}
        for group in {g.lease_id: g for g in groups}.values():
            if sampled_versions(group) != [group.version] or group.version not in self.cache.payloads:
                continue
            for older in staler_versions(group.version, step=self.step, max_staleness=self.max_staleness,
                                         older_versions=self.cfg.older_versions):
                if older in self.cache.payloads:
                    by_older.setdefault(older, []).append(group)
        claimed: dict[int, dict[str, TrainGroup]] = {}
        for group in (g for members in by_older.values() for g in members if g.lease_id not in known):
            claimed.setdefault(group.version, {})[group.lease_id] = group
        claimed_diff = dict(known)
        for version, members in claimed.items():
            diffs = recompute_mean_abs_diff(model, self.cache.get(version), list(members.values()), **check)
            claimed_diff.update(zip(members, diffs, strict=True))
        fit: set[str] = set()
        for older, members in by_older.items():
            diffs = recompute_mean_abs_diff(model, self.cache.get(older), members, **check)
            for group, diff in zip(members, diffs, strict=True):
                claimed_by = claimed_diff[group.lease_id]
                if claimed_by > LOGPROB_FIT_FLOOR and diff < LOGPROB_FIT_RATIO * claimed_by:
                    fit.add(group.lease_id)
        return fit

    def _recompute(self, model: torch.nn.Module, by_version: dict[int, list[TrainGroup]],
                   check: dict) -> dict[str, list]:
        """Groups recomputed under the versions that sampled their tokens (one version's tokens
        of every group together): lease id -> [group, sum of |differences|, tokens]."""
        totals: dict[str, list] = {}  # lease id -> [group, sum of |differences|, tokens]
        for version, members in sorted(by_version.items()):
            state = self.cache.get(version)
            sums, tokens = recompute_abs_diff(model, state, members, version=version, **check)
            self._check_sampler(model, state, [g for g in members if g.sampling_seed is not None], claimed=version,
                                version=version, **check)
            for group, diff_sum, count in zip(members, sums, tokens, strict=True):
                entry = totals.setdefault(group.lease_id, [group, 0.0, 0])
                entry[1] += diff_sum
                entry[2] += count
        return totals

    def _check_sampler(self, model: torch.nn.Module, state: dict[str, torch.Tensor] | None, groups: list[TrainGroup],
                       *, claimed: int, grpo: GRPOConfig, temperature: float, pad_id: int, precision: Precision,
                       version: int | None = None) -> None:
        """Count each group's tokens that are not the seeded sampler's choice under the
        `claimed` version (`state`: its weights, None: the model's own), and compare them with
        the choices of the older versions the cache holds (one version's groups together, in the
        step's pass layout; `version`: that version's tokens only)."""
        if not groups:
            return
        found = {"temperature": temperature, "pad_id": pad_id, "precision": precision,
                 "share_prompts": grpo.share_prompts, "budget_tokens": grpo.micro_batch_tokens,
                 "chunk_tokens": grpo.logprob_chunk_tokens, "version": version}
        under_claimed = groups_sampler_checks(model, state, groups, **found)
        older = {}
        for offset in range(1, self.cfg.older_versions + 1):
            older_state = self.cache.get(claimed - offset)
            if older_state is not None:
                older[offset] = groups_sampler_checks(model, older_state, groups, **found)
        for index, (group, mine) in enumerate(zip(groups, under_claimed, strict=True)):
            count = violations(mine.shortfalls, self.cfg.sampler_margin)
            self.sampler_checked[group.lease_id] = self.sampler_checked.get(group.lease_id, 0) + count
            checks = version_checks(mine.shortfalls, {offset: o[index].shortfalls for offset, o in older.items()},
                                    margin=self.cfg.version_margin)
            checks = with_logprob_fits(checks, mine.abs_logprob_diffs,
                                       {offset: o[index].abs_logprob_diffs for offset, o in older.items()})
            self.version_checked[group.lease_id] = merge(self.version_checked.get(group.lease_id, []), checks)

    def check_current(self, groups: list[TrainGroup], step: int, diffs: list[float]) -> list[GroupAudit]:
        """Verdicts on the groups generated at the learner's current version, from the mean
        differences train_step measured while computing the loss (only where the wire is the
        learner's weights)."""
        if not self.cfg.enabled or not self.exact_wire:
            return []
        self.step = step
        return [self._verdict(g, d, recomputed=False) for g, d in zip(groups, diffs, strict=True) if g.version == step]

    def _verdict(self, group: TrainGroup, diff: float, recomputed: bool) -> GroupAudit:
        """Failed when its log-probs are off by more than the tolerance, or more of its tokens
        than allowed are not the seeded sampler's choice (`sampler_checked` this step)."""
        sampler = self.sampler_checked.get(group.lease_id)
        failed = diff > self.cfg.max_mean_abs_logprob_diff or (sampler or 0) > self.cfg.max_sampler_violations
        checks = self.version_checked.get(group.lease_id, [])
        # held out: the coordinator asked, or its own tokens fit an older version better than the
        # claimed one, or its tokens or its log-probs fit one staler than S as well
        staler = (may_be_staler(group.version, checks, step=self.step, max_staleness=self.max_staleness)
                  or group.lease_id in self.staler_fit)
        held_out = not failed and (group.audit == "hold_out" or fits(group.version, checks) < group.version or staler)
        return GroupAudit(lease_id=group.lease_id, worker_id=group.worker_id, version=group.version,
                          tokens=sum(len(c.token_ids) for c in group.completions), mean_abs_logprob_diff=diff,
                          recomputed=recomputed, sampler_violations=sampler, version_checks=checks, failed=failed,
                          held_out=held_out)


def companions(groups: list[TrainGroup], verdicts: list[GroupAudit]) -> list[GroupAudit]:
    """The batch's groups not yet judged (left unchecked by the draw, or at the current version,
    checked inside the step) of a worker one of whose groups failed or was held out: held out
    with it. A worker that turns to lying after earning standing is checked by chance; the
    groups the draw left unchecked beside its first caught one would train."""
    caught = {v.worker_id for v in verdicts if v.failed or v.held_out}
    seen = {v.lease_id for v in verdicts}
    return [GroupAudit(lease_id=g.lease_id, worker_id=g.worker_id, version=g.version,
                       tokens=sum(len(c.token_ids) for c in g.completions), mean_abs_logprob_diff=0.0,
                       recomputed=False, sampler_violations=None, failed=False, held_out=True)
            for g in groups if g.worker_id in caught and g.lease_id not in seen]


def audit_summary(verdicts: list[GroupAudit]) -> dict:
    """A step's verdicts for metrics.jsonl: counts, and per worker the largest difference among
    groups that passed (what an operator tightens the tolerance against) and the failures."""
    by_worker: dict[str, dict] = {}
    for v in verdicts:
        w = by_worker.setdefault(v.worker_id, {"audited": 0, "failed": 0, "max_passed_diff": 0.0})
        w["audited"] += 1
        if v.failed:
            w["failed"] += 1
        else:
            w["max_passed_diff"] = max(w["max_passed_diff"], v.mean_abs_logprob_diff)
    return {"groups_audited": len(verdicts), "groups_recomputed": sum(v.recomputed for v in verdicts),
            "groups_failed": sum(v.failed for v in verdicts), "by_worker": by_worker,
            "groups_sampler_checked": sum(v.sampler_violations is not None for v in verdicts),
            "sampler_violations": sum(v.sampler_violations or 0 for v in verdicts),
            "failed_lease_ids": [v.lease_id for v in verdicts if v.failed]}


def audit_skip_reason(verdicts: list[GroupAudit], tolerance: float) -> str:
    """Why the audit skips the step before training ("": it does not): groups that failed, or
    groups held out (GroupAudit.held_out); the step is redone without them."""
    failed = [v for v in verdicts if v.failed]
    held = [v for v in verdicts if v.held_out]
    reasons = []
    if failed:
        reasons.append(f"{len(failed)} group(s) checked under the versions they claim have log-probs off by more "
                       f"than {tolerance:g} nats per token or tokens the seeded sampler would not have drawn "
                       f"(workers {sorted({v.worker_id for v in failed})})")
    if held:
        reasons.append(f"{len(held)} group(s) held out: their tokens fit an older version than they claim (better than "
                       f"the claimed one, or one staler than S as well), their worker's version evidence leans "
                       f"against it, or they came beside such a group of their worker "
                       f"(workers {sorted({v.worker_id for v in held})})")
    return "rollout audit: " + "; ".join(reasons) if reasons else ""
