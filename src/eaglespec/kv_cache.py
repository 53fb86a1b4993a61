"""The only code that touches KV-cache internals: make, measure, crop, keep the accepted path.

Caches are transformers' `DynamicCache`, whose layers hold `keys` / `values` as [B, heads, S, d].
"""

import torch
from transformers import DynamicCache
from transformers.cache_utils import DynamicLayer, DynamicSlidingWindowLayer

from .errors import EagleError


def new_cache(config) -> DynamicCache:
    cache = DynamicCache(config=config)
    if any(isinstance(layer, DynamicSlidingWindowLayer) for layer in cache.layers):
        raise EagleError(
            f"{config.model_type} uses sliding-window attention (sliding_window={getattr(config, 'sliding_window', None)}); "
            "tree verification needs a full KV cache. Use a checkpoint without a sliding window "
            "(e.g. set sliding_window to null in its config.json)."
        )
    return cache


def cache_length(cache: DynamicCache) -> int:
    return cache.get_seq_length()


def crop(cache: DynamicCache, length: int) -> None:
    """Drop every entry at or after `length` (sliced here: `Cache.crop`'s meaning changed across
    transformers versions)."""
    if cache_length(cache) <= length:
        return
    for layer in cache.layers:
        if layer.keys is not None:
            layer.keys = layer.keys[:, :, :length]
            layer.values = layer.values[:, :, :length]


def keep_path(cache: DynamicCache, start: int, path: torch.Tensor) -> None:
    """After verification: of the entries written from `start` on (one per tree node), keep only
    those of the accepted path, in path order, directly after `start`.

    path: [a+1] tree node indices (root first). A chain prefix (0, 1, ..., a) is a plain crop.
    """
    n = path.numel()
    if torch.equal(path, torch.arange(n, device=path.device)):
        crop(cache, start + n)
        return
    index = path.to(torch.long) + start
    for layer in cache.layers:
        if type(layer) is not DynamicLayer:  # a layer we cannot edit would keep stale tree entries
            raise EagleError(f"cannot compact a {type(layer).__name__} cache layer; only full (DynamicLayer) caches are supported")
        if layer.keys is None:
            continue
        for name in ("keys", "values"):
            t = getattr(layer, name)  # [B, heads, S, d]
            # the path only moves entries towards `start`: gather, write in place, keep a view
            t[:, :, start:start + n] = t.index_select(2, index.to(t.device))
            setattr(layer, name, t[:, :, :start + n])
