"""Sharing a prompt's key/value cache among the completions that continue it: the learner's
shared-prompt passes (learner.shared_prefix) and the HF engine's sampling of a group (G
completions of one prompt, the prompt computed once) both build on these helpers.

transformers names the cache argument `cache` from release 5.20 and `past_key_values` before;
`cache_argument` reads which from the model body's signature.
"""

from __future__ import annotations

import functools
import inspect

import torch


def supports_shared_prefix(model) -> bool:
    """A cache can be computed once and continued by many rows: the model body takes and returns
    one, every layer attends to every earlier position (no sliding window, no recurrent state),
    and no activation checkpointing (transformers drops the cache under it while training)."""
    body = getattr(model, "base_model", None)
    config = getattr(model, "config", None)
    if body is None or body is model or config is None or cache_argument(type(body)) is None:
        return False
    if any(getattr(module, "gradient_checkpointing", False) for module in model.modules()):
        return False
    layer_types = getattr(config, "layer_types", None)
    if layer_types is not None and any(t != "full_attention" for t in layer_types):
        return False
    if layer_types is None and getattr(config, "sliding_window", None) and getattr(config, "use_sliding_window", True):
        return False
    return True


@functools.cache
def cache_argument(body_class: type) -> str | None:
    """The name the model body (and `generate`) takes a cache by."""
    parameters = inspect.signature(body_class.forward).parameters
    return next((name for name in ("cache", "past_key_values") if name in parameters), None)


def returned_cache(output):
    """The cache a forward with use_cache=True returned, under either name."""
    cache = getattr(output, "cache", None)
    return cache if cache is not None else getattr(output, "past_key_values", None)


def expand_cache(cache, rows_R: torch.Tensor):
    """A new cache whose row r continues row `rows_R[r]` of `cache` (index_select: its backward
    sums the rows' gradients into the shared one)."""
    from transformers.cache_utils import DynamicCache

    if hasattr(cache, "layers"):
        layers = [(layer.keys, layer.values) for layer in cache.layers]
    else:
        layers = list(zip(cache.key_cache, cache.value_cache, strict=True))
    return DynamicCache(ddp_cache_data=[(k.index_select(0, rows_R), v.index_select(0, rows_R)) for k, v in layers])
