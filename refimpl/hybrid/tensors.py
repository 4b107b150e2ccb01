"""Allocate the planned cache memory and give every layer a tensor view of its own pages.

Follows vLLM v1's worker (`_allocate_kv_cache_tensors`, `_reshape_attention_kv_cache`):

- **packed** (`block_stride > 0`): one int8 backing tensor for the whole slab; a layer's view
  is
  `raw.view(-1, block_stride)[:, offset : offset + page]`, so `view.stride(0)` is the block
  stride and block b of the layer starts at byte `offset + b * block_stride`;
- **padded** (the spec has `page_size_padded`): `torch.as_strided` whose block stride is the
  padded page, so the padding bytes between pages are skipped;
- **contiguous**: a plain reshape of the layer's own tensor.

Backend shapes follow the vLLM KV-cache article: DeepSeek V4's fp8_ds_mla caches are
`(num_blocks, entries, 584)` uint8; other one-row-per-entry caches are `(num_blocks, entries,
head_size)`; ordinary attention layers are `(num_blocks, 2, block_size, num_kv_heads,
head_size)` (key then value).
"""

from __future__ import annotations

from collections.abc import Mapping
from math import prod

import torch

from refimpl.errors import InvariantError
from refimpl.hybrid.kv_cache_interface import (
    AttentionSpec,
    KVCacheConfig,
    KVCacheSpec,
    KVCacheTensor,
    MLAAttentionSpec,
    SlidingWindowMLASpec,
)


def _is_row_cache(spec: KVCacheSpec) -> bool:
    """MLA-style caches keep one row per stored entry (no separate key and value)."""
    return isinstance(spec, (MLAAttentionSpec, SlidingWindowMLASpec))


def kv_cache_shape(spec: AttentionSpec, num_blocks: int) -> tuple[int, ...]:
    """The backend's tensor shape for `num_blocks` blocks of this layer (block dimension
    first)."""
    if _is_row_cache(spec):
        row = spec.entry_bytes // spec.dtype_size
        entries = spec.storage_block_size
        if spec.cache_dtype_str == "fp8_ds_mla" and spec.model_version != "deepseek_v4":
            entries = spec.block_size  # V3.2 layout: one 656-byte row per token
        if spec.num_kv_heads == 1:
            return (num_blocks, entries, row)
        return (num_blocks, entries, spec.num_kv_heads, row // spec.num_kv_heads)
    return (num_blocks, 2, spec.storage_block_size, spec.num_kv_heads, spec.head_size)


def entry_stride_bytes(spec: AttentionSpec) -> int:
    """Bytes from one stored entry (token row) to the next inside a page."""
    if _is_row_cache(spec):
        return spec.entry_bytes
    return spec.num_kv_heads * spec.head_size * spec.dtype_size


def _layer_tensors(config: KVCacheConfig) -> dict[str, KVCacheTensor]:
    layer_tensor: dict[str, KVCacheTensor] = {}
    for tensor in config.kv_cache_tensors:
        for name in tensor.shared_by:
            if name in layer_tensor:
                raise InvariantError(f"layer {name} is listed by two KVCacheTensors")
            layer_tensor[name] = tensor
    group_layers = {n for g in config.kv_cache_groups for n in g.layer_names}
    if set(layer_tensor) != group_layers:
        missing = sorted(group_layers - set(layer_tensor))[:3]
        extra = sorted(set(layer_tensor) - group_layers)[:3]
        raise InvariantError(
            f"tensors and groups disagree: no tensor for {missing}, no group for {extra}"
        )
    return layer_tensor


def allocate_kv_cache(
    config: KVCacheConfig, device: str | torch.device = "cpu"
) -> dict[str, torch.Tensor]:
    """Allocate zeroed memory for `config` and return {layer name: its cache view}.

    A packed config gets exactly one backing tensor that every view aliases.
    """
    layer_tensor = _layer_tensors(config)
    raw_of: dict[int, torch.Tensor] = {}  # id(KVCacheTensor) -> backing bytes
    packed_backing = None
    for tensor in config.kv_cache_tensors:
        if tensor.block_stride > 0:
            if packed_backing is None:
                packed_backing = torch.zeros(tensor.size, dtype=torch.int8, device=device)
            elif packed_backing.numel() != tensor.size:
                raise InvariantError("packed KVCacheTensors disagree on the slab size")
            raw_of[id(tensor)] = packed_backing
        else:
            raw_of[id(tensor)] = torch.zeros(tensor.size, dtype=torch.int8, device=device)

    views: dict[str, torch.Tensor] = {}
    for group in config.kv_cache_groups:
        for name in group.layer_names:
            tensor = layer_tensor[name]
            views[name] = _layer_view(
                raw_of[id(tensor)], tensor, group.layer_spec(name), tensor.layer_offset(name)
            )
    return views


def _layer_view(
    raw: torch.Tensor, tensor: KVCacheTensor, spec: AttentionSpec, offset: int | None = None
) -> torch.Tensor:
    dtype, size = spec.torch_dtype, spec.dtype_size
    if tensor.block_stride > 0:
        num_blocks = raw.numel() // tensor.block_stride
        shape = kv_cache_shape(spec, num_blocks)
        page_bytes = prod(shape[1:]) * size
        offset = tensor.offset if offset is None else offset
        if tensor.block_stride % size or offset % size:
            raise ValueError(
                f"a {spec.dtype} view needs block_stride {tensor.block_stride} and offset "
                f"{offset} to be multiples of {size} bytes"
            )
        rows = raw.view(-1, tensor.block_stride)[:, offset : offset + page_bytes]
        return rows.view(dtype).view(shape)
    num_blocks = raw.numel() // spec.page_size_bytes
    shape = kv_cache_shape(spec, num_blocks)
    if spec.page_size_padded is not None:
        if spec.page_size_bytes % size:
            raise ValueError(
                f"padded page {spec.page_size_bytes} is not a multiple of {size} bytes"
            )
        strides = list(torch.empty(shape, device="meta").stride())
        strides[0] = spec.page_size_bytes // size  # skip the padding between pages
        return torch.as_strided(raw.view(dtype), size=shape, stride=tuple(strides))
    return raw[: num_blocks * spec.page_size_bytes].view(dtype).view(shape)


def view_kind(config: KVCacheConfig, layer_name: str) -> str:
    """ "packed", "padded" or "contiguous": which of the three view recipes a layer gets."""
    tensor = _layer_tensors(config)[layer_name]
    if tensor.block_stride > 0:
        return "packed"
    spec = next(
        g.layer_spec(layer_name) for g in config.kv_cache_groups if layer_name in g.layer_names
    )
    return "padded" if spec.page_size_padded is not None else "contiguous"


def byte_address(
    config: KVCacheConfig, layer_name: str, block_id: int, token_offset: int, kv: int = 0
) -> int:
    """Byte offset, from the start of the layer's backing tensor, of one stored entry.

    `token_offset` counts stored entries inside the block (0..storage_block_size-1: for a
    ratio-4 layer, entry j holds the compressed tokens 4j..4j+3 of the block). `kv` picks the
    key (0) or value (1) row of an ordinary attention layer.
    """
    tensor = _layer_tensors(config)[layer_name]
    group = next(g for g in config.kv_cache_groups if layer_name in g.layer_names)
    spec = group.layer_spec(layer_name)
    entries = kv_cache_shape(spec, 1)[1 if _is_row_cache(spec) else 2]
    if not 0 <= block_id < config.num_blocks:
        raise ValueError(f"block_id {block_id} outside [0, {config.num_blocks})")
    if not 0 <= token_offset < entries:
        raise ValueError(
            f"token_offset {token_offset} outside [0, {entries}) for {layer_name}"
        )
    if kv not in (0, 1) or (kv == 1 and _is_row_cache(spec)):
        raise ValueError("kv must be 0 (key), or 1 (value) for layers that store a value row")
    block_start = tensor.layer_offset(layer_name) + block_id * (
        tensor.block_stride or spec.page_size_bytes
    )
    value_shift = kv * spec.storage_block_size * entry_stride_bytes(spec)
    return block_start + value_shift + token_offset * entry_stride_bytes(spec)


def view_byte_address(
    view: torch.Tensor, block_id: int, token_offset: int, kv: int | None = None
) -> int:
    """The same address computed only from a view's own strides and storage offset."""
    index = [block_id, token_offset] if kv is None else [block_id, kv, token_offset]
    elements = view.storage_offset() + sum(i * s for i, s in zip(index, view.stride()))
    return elements * view.element_size()


class CacheLayer:
    """Stands in for a model's attention module: it only holds the cache view bound to it."""

    def __init__(self, name: str, spec: KVCacheSpec) -> None:
        self.name = name
        self.spec = spec
        self.kv_cache: torch.Tensor | None = None

    def bind_kv_cache(self, kv_cache: torch.Tensor) -> None:
        self.kv_cache = kv_cache

    def __repr__(self) -> str:
        shape = None if self.kv_cache is None else tuple(self.kv_cache.shape)
        return f"CacheLayer({self.name!r}, kv_cache shape={shape})"


def make_layers(config: KVCacheConfig) -> dict[str, CacheLayer]:
    """One CacheLayer per layer of the config, in group order."""
    return {
        n: CacheLayer(n, g.layer_spec(n))
        for g in config.kv_cache_groups
        for n in g.layer_names
    }


def bind_kv_cache(
    kv_caches: Mapping[str, torch.Tensor], layers: Mapping[str, CacheLayer]
) -> None:
    """Give every layer object its view (`layer.kv_cache = view`), checking names first."""
    missing = sorted(set(kv_caches) - set(layers))
    if missing:
        raise ValueError(f"no layer object for cache views {missing[:3]}")
    for name, view in kv_caches.items():
        layers[name].bind_kv_cache(view)
