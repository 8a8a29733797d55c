"""HF transformers engine: batched `generate` with sampling, behaviour log-probs taken from the
processed scores, i.e. exactly the distribution each token was sampled from."""

from __future__ import annotations

import time

import torch
from transformers import LogitsProcessorList, StoppingCriteria, StoppingCriteriaList

from echo2.config.run import LoraConfig
from echo2.config.worker import SlowdownClock, slowdown_idle_s
from echo2.models.device import resolve_device, resolve_dtype
from echo2.models.generation import strip_completion
from echo2.models.kv_cache import cache_argument, expand_cache, returned_cache, supports_shared_prefix
from echo2.models.loading import load_model, load_tokenizer
from echo2.models.weights import load_into
from echo2.protocol.token_versions import encode
from echo2.rollout.engine import Completion, Engine, GenRequest, InFlight


class SeededSampler:
    """A logits processor for HF generate: at each step, logits / T plus the seeded sampler's
    Gumbel noise (models/sampler.py), whose argmax greedy decoding then takes: an exact draw
    from softmax(logits / T) that the learner can recompute."""

    def __init__(self, *, temperature: float, prompt_width: int, seeds_R: list[int], samples_R: torch.Tensor,
                 first_positions_R: torch.Tensor) -> None:
        self.temperature, self.width = temperature, prompt_width
        self.seeds_R, self.samples_R, self.first_positions_R = seeds_R, samples_R, first_positions_R

    def __call__(self, input_ids: torch.Tensor, scores: torch.Tensor) -> torch.Tensor:
        from echo2.models.sampler import perturbed

        positions = self.first_positions_R + (input_ids.shape[1] - self.width)
        out = torch.empty(scores.shape, dtype=torch.float32, device=scores.device)
        for seed in set(self.seeds_R):  # rows of one lease share its seed
            rows = torch.tensor([r for r, s in enumerate(self.seeds_R) if s == seed], device=scores.device)
            out[rows] = perturbed(scores[rows], self.temperature, seed, samples_N=self.samples_R[rows],
                                  positions_N=positions[rows]).float()
        return out


class _Pace:
    """EMULATION ONLY (worker.slowdown): after each decode step, idle (slowdown - 1) x the time
    the step took, so a generation lasts as long as on hardware that much slower, token by
    token (a version can arrive mid-generation as it would there), and leaves the CPU to the
    learner meanwhile. A logits processor that changes nothing."""

    def __init__(self, slowdown: float, clock: SlowdownClock) -> None:
        self.slowdown, self.clock = slowdown, clock
        self.last, self.last_cpu = time.perf_counter(), time.process_time()

    def __call__(self, input_ids: torch.Tensor, scores: torch.Tensor) -> torch.Tensor:
        time.sleep(slowdown_idle_s(self.slowdown, self.clock, time.perf_counter() - self.last,
                                   time.process_time() - self.last_cpu))
        self.last, self.last_cpu = time.perf_counter(), time.process_time()
        return scores


class _SegmentStop(StoppingCriteria):
    """Ends a generate call for every row at a segment boundary (a multiple of segment_tokens
    new tokens, counting the `offset` generated before this call) where a newer version waits."""

    def __init__(self, inflight: InFlight, offset: int) -> None:
        self.inflight, self.offset, self.width, self.fired = inflight, offset, 0, False

    def __call__(self, input_ids: torch.Tensor, scores, **kwargs) -> torch.Tensor:
        made = self.offset + input_ids.shape[1] - self.width
        if made % self.inflight.segment_tokens == 0 and self.inflight.pending():
            self.fired = True
        return torch.full((input_ids.shape[0],), self.fired, dtype=torch.bool, device=input_ids.device)


class HFEngine(Engine):
    seeded = True

    def __init__(self, model, tokenizer) -> None:
        self.model = model.eval()
        self.tokenizer = tokenizer
        self.device = next(model.parameters()).device
        self.lora: LoraConfig | None = None  # set once the first adapter version arrives
        self.slowdown, self.slowdown_clock = 1.0, "wall"
        """EMULATION ONLY: worker.slowdown and its clock, paced per decode step (`_Pace`)."""

    @classmethod
    def from_pretrained(cls, source: str, device: str = "auto", dtype: str = "auto") -> HFEngine:
        """`device` and `dtype` as in the worker config: "auto" is the first CUDA GPU in bfloat16
        when torch sees one, else the CPU in float32."""
        where = resolve_device(device, "worker.device")
        weights = str(resolve_dtype(dtype, where)).removeprefix("torch.")
        return cls(load_model(source, where, weights), load_tokenizer(source))

    def load_state_dict(self, tensors: dict) -> None:
        # refuses a payload that does not match this model's tensors (another model's weights)
        load_into(self.model, tensors)

    def load_adapter(self, tensors: dict, lora: LoraConfig) -> None:
        """Adapters are added to the base model on the first adapter version and kept unmerged
        (what the learner computes log-probs with); later versions only copy their weights."""
        from echo2.models.lora import add_lora, load_adapter

        if self.lora is None:
            add_lora(self.model, lora)
            self.model.eval()
            self.lora = lora
        elif lora != self.lora:
            raise ValueError(f"adapter settings changed from {self.lora} to {lora}; restart the worker")
        load_adapter(self.model, tensors)

    def greedy(self, prompts: list[list[int]], max_new_tokens: int) -> list[list[int]]:
        """One left-padded batch, as `echo2 eval` generates (the same completions)."""
        from echo2.models.generation import generate_ids

        if not prompts:
            return []
        return generate_ids(self.model, prompts, max_new_tokens=max_new_tokens, temperature=0.0,
                            pad_id=self.tokenizer.pad_token_id, eos_id=self.tokenizer.eos_token_id)

    @torch.no_grad()
    def generate(self, requests: list[GenRequest], inflight: InFlight | None = None) -> list[list[Completion]]:
        if not requests:
            return []
        # one generate call per (temperature, max_new_tokens) setting; a lease normally has one
        out: list[list[Completion]] = [[] for _ in requests]
        by_setting: dict[tuple[float, int, bool], list[int]] = {}
        for index, req in enumerate(requests):
            seeded = req.seed is not None and req.temperature > 0
            by_setting.setdefault((req.temperature, req.max_new_tokens, seeded), []).append(index)
        last = len(by_setting) - 1
        for k, ((temperature, max_new, seeded), indices) in enumerate(by_setting.items()):
            # swaps only in the last setting's rows: a completion's empty token_versions means the
            # version the call started with, which every row of an earlier setting still is
            flat = iter(self._segments([requests[i] for i in indices], temperature, max_new, seeded=seeded,
                                       inflight=inflight if k == last else None))
            for i in indices:
                out[i] = [next(flat) for _ in range(requests[i].n)]
        return out

    def _segments(self, requests: list[GenRequest], temperature: float, max_new: int, *, seeded: bool,
                  inflight: InFlight | None) -> list[Completion]:
        """The n completions of each request, generated in segments when `inflight` allows: a
        newer version staged at a boundary is swapped in and the unfinished rows go on from
        their tokens so far (their prompts computed again under it; within a version the KV
        cache is kept, since a generate call only stops for a swap)."""
        rows = [(req, j) for req in requests for j in range(req.n)]
        ids: list[list[int]] = [[] for _ in rows]
        logps: list[list[float]] = [[] for _ in rows]
        versions: list[list[int]] = [[] for _ in rows]
        version = inflight.version if inflight is not None else 0
        batch, todo, offset = requests, list(range(len(rows))), 0
        while True:
            stop = _SegmentStop(inflight, offset) if inflight is not None and inflight.segment_tokens > 0 else None
            parts = self._sample(batch, temperature, max_new - offset, seeded=seeded, stop=stop)
            for r, (tokens, values) in zip(todo, parts, strict=True):
                ids[r] += tokens
                logps[r] += values
                versions[r] += [version] * len(tokens)
            todo = [r for r in todo if not (ids[r] and ids[r][-1] == self.tokenizer.eos_token_id)
                    and len(ids[r]) < max_new]
            if stop is None or not stop.fired or not todo:
                break
            version, offset = inflight.swap(), len(ids[todo[0]])  # unfinished rows are equally long
            batch = [GenRequest(rows[r][0].prompt_ids + ids[r], 1, temperature, max_new - offset,
                                seed=rows[r][0].seed, first_sample=rows[r][0].first_sample + rows[r][1],
                                first_position=rows[r][0].first_position + offset) for r in todo]
        return [Completion(token_ids=t, logprobs=lp, token_versions=encode(v))
                for t, lp, v in zip(ids, logps, versions, strict=True)]

    def _sample(self, requests: list[GenRequest], temperature: float, max_new: int, *, seeded: bool,
                stop: _SegmentStop | None = None) -> list[tuple[list[int], list[float]]]:
        """The n completions of each request, as (token ids, log-probs), each prompt computed
        once when the model allows it (its cache expanded to its n rows: a long prompt is
        computed once, not n times). `stop`: end every row at a segment boundary where a
        newer version waits (`stop.fired`); rows cut there keep every token they have."""
        prompts = [req.prompt_ids for req in requests]
        pad, eos = self.tokenizer.pad_token_id, self.tokenizer.eos_token_id
        width = max(len(p) for p in prompts)
        ids = torch.tensor([[pad] * (width - len(p)) + p for p in prompts], device=self.device)
        mask = torch.tensor([[0] * (width - len(p)) + [1] * len(p) for p in prompts], device=self.device)
        rows_R = torch.repeat_interleave(torch.arange(len(prompts), device=self.device),
                                         torch.tensor([req.n for req in requests], device=self.device))
        extra = self._prompt_cache(ids, mask, rows_R) if width > 1 and supports_shared_prefix(self.model) else {}
        if seeded:  # greedy over the seeded sampler's perturbed scores; log-probs from the raw logits
            first_row = torch.cumsum(torch.tensor([0] + [req.n for req in requests[:-1]], device=self.device), 0)
            first_sample = torch.tensor([req.first_sample for req in requests], device=self.device)
            first_position = torch.tensor([req.first_position for req in requests], device=self.device)
            samples_R = torch.arange(len(rows_R), device=self.device) - first_row[rows_R] + first_sample[rows_R]
            seeds_R = [requests[r].seed for r in rows_R.tolist()]
            sampler = SeededSampler(temperature=temperature, prompt_width=width, seeds_R=seeds_R, samples_R=samples_R,
                                    first_positions_R=first_position[rows_R])
            sampling = {"do_sample": False, "logits_processor": LogitsProcessorList([sampler]), "output_logits": True}
        else:  # no truncation: the learner scores tokens under the full softmax
            sampling = {"do_sample": True, "temperature": temperature, "top_k": 0, "top_p": 1.0, "output_scores": True}
        if self.slowdown > 1:
            sampling["logits_processor"] = LogitsProcessorList([*sampling.get("logits_processor", []),
                                                                _Pace(self.slowdown, self.slowdown_clock)])
        if stop is not None:
            stop.width = width
            sampling["stopping_criteria"] = StoppingCriteriaList([stop])
        gen = self.model.generate(input_ids=ids[rows_R], attention_mask=mask[rows_R], max_new_tokens=max_new,
                                  pad_token_id=pad, eos_token_id=eos, return_dict_in_generate=True,
                                  **sampling, **extra)
        new_ids = gen.sequences[:, width:]
        steps = [s.float() / temperature for s in gen.logits] if seeded else [s.float() for s in gen.scores]
        logp_NT = torch.stack([torch.log_softmax(s, dim=-1) for s in steps], dim=1)
        token_logp = logp_NT.gather(-1, new_ids[..., None]).squeeze(-1)
        cut = stop is not None and stop.fired
        out = []
        for row, row_logp in zip(new_ids.tolist(), token_logp.tolist(), strict=True):
            kept = row if cut and eos not in row else strip_completion(row, eos, pad)
            out.append((kept, row_logp[: len(kept)]))
        return out

    def _prompt_cache(self, ids: torch.Tensor, mask: torch.Tensor, rows_R: torch.Tensor) -> dict:
        """Every prompt but its last token through the model once, positions as generate counts
        them (left padding skipped), the cache expanded to each prompt's rows: generate then
        computes only the last prompt token of each row and what follows."""
        body = self.model.base_model
        positions = (mask.cumsum(-1) - 1).clamp(min=0)
        prefix = body(input_ids=ids[:, :-1], attention_mask=mask[:, :-1], position_ids=positions[:, :-1],
                      use_cache=True)
        return {cache_argument(type(body)): expand_cache(returned_cache(prefix), rows_R)}
