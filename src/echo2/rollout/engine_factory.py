"""The engine a worker's config names. Apart from engine.py (the interface the engines
implement) so that the interface never imports its implementations."""

from __future__ import annotations

from echo2.config.run import LoraConfig
from echo2.config.worker import WorkerConfig
from echo2.rollout.engine import Engine


def engine_type(name: str) -> type[Engine]:
    """The class `worker.engine` names: its `seeded` is what the worker registers with, before
    any model loads (the vLLM engine's module imports vLLM only when it builds its engine)."""
    if name == "hf":
        from echo2.rollout.hf_engine import HFEngine

        return HFEngine
    if name == "vllm":
        from echo2.rollout.vllm_engine import VLLMEngine

        return VLLMEngine
    raise ValueError(f"worker.engine: unknown engine {name!r} (allowed: 'hf', 'vllm')")


def make_engine(cfg: WorkerConfig, model_source: str, lora: LoraConfig | None = None) -> Engine:
    """The engine `cfg.engine` names, on `cfg.device` ("auto" resolves on this machine). `lora`:
    the run's adapter settings when it trains LoRA (vLLM reserves adapter room when it is built;
    the HF engine adds adapters when the first adapter version arrives)."""
    engine = engine_type(cfg.engine)
    if cfg.engine == "vllm":
        return engine(model_source, cfg.device, cfg.vllm, lora)
    return engine.from_pretrained(model_source, cfg.device, cfg.dtype)
