"""The engine a worker's config names. Apart from engine.py (the interface the engines
implement) so that the interface never imports its implementations."""

from __future__ import annotations

from echo2.config.run import LoraConfig
from echo2.config.worker import WorkerConfig
from echo2.rollout.engine import Engine


def make_engine(cfg: WorkerConfig, model_source: str, lora: LoraConfig | None = None) -> Engine:
    """The engine `cfg.engine` names, on `cfg.device` ("auto" resolves on this machine). `lora`:
    the run's adapter settings when it trains LoRA (vLLM reserves adapter room when it is built;
    the HF engine adds adapters when the first adapter version arrives)."""
    if cfg.engine == "hf":
        from echo2.rollout.hf_engine import HFEngine

        return HFEngine.from_pretrained(model_source, cfg.device, cfg.dtype)
    if cfg.engine == "vllm":
        from echo2.rollout.vllm_engine import VLLMEngine

        return VLLMEngine(model_source, cfg.device, cfg.vllm, lora)
    raise ValueError(f"worker.engine: unknown engine {cfg.engine!r} (allowed: 'hf', 'vllm')")
