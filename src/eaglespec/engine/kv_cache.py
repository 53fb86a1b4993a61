"""The only code that touches KV-cache internals: make, measure, crop, keep the accepted path.

Caches are transformers' `DynamicCache`, whose layers hold `keys` / `values` as [B, heads, S, d].
"""

import torch
from transformers import DynamicCache
from transformers.cache_utils import DynamicLayer, DynamicSlidingWindowLayer

from ..errors import EagleError


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


class RowCache:
    """A `DynamicCache` shared by B sequences of different lengths (rows right-padded in place).

    Row r's entries are slots [0, lens[r]); slots after that are stale (another row's growth, or
    tree nodes that were not accepted) and every forward masks them out with `valid`. New tokens
    of all rows are appended together at the cache's end, then `keep_paths` moves each row's
    accepted entries down to directly after its own length. Why this layout and not a paged one:
    a step appends at most one tree per row, so the padding a row carries is bounded by how far
    the longest row is ahead; on a CPU the stock attention over a contiguous [B, heads, S, d]
    tensor is the fast path, and gathering pages would cost a copy of the cache every step.
    """

    def __init__(self, cache: DynamicCache, lens: list[int]):
        self.cache = cache
        self.lens = torch.tensor(lens, dtype=torch.long)  # [B] valid entries per row

    def __len__(self) -> int:
        return self.lens.numel()

    @property
    def length(self) -> int:
        """Slots in the cache tensors (>= every row's length)."""
        return cache_length(self.cache)

    def valid(self, upto: int, device=None) -> torch.Tensor:
        """[B, upto] bool: slot j holds an entry of row r."""
        return torch.arange(upto, device=device)[None] < self.lens.to(device)[:, None]

    def keep_paths(self, start: int, paths: list[torch.Tensor]) -> None:
        """After a forward that appended one block per row at `start`: keep, for each row, the
        entries of its accepted path (block-relative indices, root first), in path order, directly
        after the row's length; then drop the slots no row needs."""
        counts = [p.numel() for p in paths]
        if in_place(self.lens, start, paths):
            crop(self.cache, start + max(counts))  # chains on rows of equal length: a plain crop
            self.lens += torch.tensor(counts)
            return
        tensors = []
        for layer in self.cache.layers:
            if type(layer) is not DynamicLayer:
                raise EagleError(f"cannot compact a {type(layer).__name__} cache layer; only full (DynamicLayer) caches are supported")
            if layer.keys is not None:
                tensors += [layer.keys, layer.values]
        move_paths(tensors, self.lens, start, paths)
        self.lens += torch.tensor(counts)
        crop(self.cache, int(self.lens.max()))

    def crop(self, length: int) -> None:
        """Forget every entry at or after slot `length`, in every row."""
        crop(self.cache, length)
        self.lens = self.lens.clamp(max=length)

    def select(self, rows: list[int]) -> None:
        """Keep only these rows (in this order)."""
        index = torch.tensor(rows, dtype=torch.long)
        self.lens = self.lens[index]
        for layer in self.cache.layers:
            if layer.keys is not None and layer.keys.numel():
                layer.keys = layer.keys.index_select(0, index.to(layer.keys.device))
                layer.values = layer.values.index_select(0, index.to(layer.values.device))
        if rows:
            crop(self.cache, int(self.lens.max()))

    def extend(self, other: "RowCache") -> None:
        """Append other's rows after ours (the shorter side is padded with zero slots)."""
        length = max(self.length, other.length)
        for mine, theirs in zip(self.cache.layers, other.cache.layers):
            if theirs.keys is None:
                continue
            if mine.keys is None or not mine.keys.numel():
                mine.lazy_initialization(theirs.keys, theirs.values)
                mine.keys, mine.values = theirs.keys[:0], theirs.values[:0]
            for name in ("keys", "values"):
                a, b = _pad_slots(getattr(mine, name), length), _pad_slots(getattr(theirs, name), length)
                setattr(mine, name, torch.cat([a, b], dim=0))
        self.lens = torch.cat([self.lens, other.lens])


def in_place(lens: torch.Tensor, start: int, paths: list[torch.Tensor]) -> bool:
    """Every row ends at `start` and accepted a chain prefix: its entries are already in place."""
    return all(int(n) == start for n in lens) and all(torch.equal(p.cpu(), torch.arange(p.numel())) for p in paths)


def move_paths(tensors: list[torch.Tensor], lens: torch.Tensor, start: int, paths: list[torch.Tensor]) -> None:
    """In each [..., B', heads, S, d] tensor (B' >= B rows; extra rows untouched; leading dims: a
    stack of layers' buffers, moved at once): row r's entries at start + paths[r] move, in path
    order, to directly after its lens[r] entries."""
    n, width = len(paths), max(p.numel() for p in paths)
    src = torch.zeros(n, width, dtype=torch.long)
    for r, p in enumerate(paths):
        src[r, : p.numel()] = p.cpu() + start
    dst = lens[:, None] + torch.arange(width)[None]  # [B, width]; pads land past the row's new length
    for t in tensors:
        rows = t.narrow(-4, 0, n)
        lead = tuple(rows.shape[:-4])
        shape, view = (*lead, n, t.shape[-3], width, t.shape[-1]), (1,) * len(lead) + (n, 1, width, 1)
        moved = rows.gather(-2, src.to(t.device).view(view).expand(shape))
        rows.scatter_(-2, dst.to(t.device).view(view).expand(shape), moved)


def _pad_slots(t: torch.Tensor, length: int) -> torch.Tensor:
    """[B, heads, S, d] -> [B, heads, length, d], zero slots appended."""
    if t.shape[2] >= length:
        return t
    return torch.nn.functional.pad(t, (0, 0, 0, length - t.shape[2]))
