"""The decode kernel's online softmax in plain torch, one tile at a time, so each step can be looked at.

`_paged_decode_kernel` never holds a whole row of scores: it walks the context in tiles of
`BLOCK_N` positions, looking up each position's block in the block table, and keeps three running
values: the largest score so far `m`, the sum `l` of `exp(score - m)`, and the sum `acc` of
`exp(score - m) * v`. When a tile brings a larger score, what was summed under the old maximum is
rescaled by `alpha = exp(m_old - m_new)`. The answer is `acc / l`.

`OnlineSoftmax` runs that recurrence for one (sequence, query head) and exposes the state after
every tile; `paged_decode_online` runs it for every sequence and head and must equal the torch twin
`reference.paged_decode_attention` (and so the Triton kernel). The kernel works in base 2
(`exp2`, scores scaled by log2(e)); this module uses natural `exp`, which gives the same numbers
up to rounding.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch

from refimpl.kernels import reference


@dataclass(frozen=True)
class SoftmaxState:
    """The running values after `tiles_done` tiles (positions `0 .. positions_done - 1` read)."""

    tiles_done: int
    positions_done: int
    tile: tuple[int, int] | None  # [start, stop) of the latest tile, None before the first
    tile_scores: tuple[float, ...]  # the latest tile's scaled scores q.k * scale
    m: float  # running max (-inf before the first tile)
    l: float  # running sum of exp(score - m)
    alpha: float  # the rescale factor the latest tile applied to l and acc (1.0 if m did not grow)
    acc: tuple[float, ...]  # running sum of exp(score - m) * v, [head_dim]

    @property
    def output(self) -> tuple[float, ...]:
        """acc / l: the attention output if the context ended here."""
        if self.l == 0.0:
            return tuple(float("nan") for _ in self.acc)
        return tuple(a / self.l for a in self.acc)


class OnlineSoftmax:
    """One query against a paged context, walked tile by tile like `_paged_decode_kernel`."""

    def __init__(self, q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor, seqlen: int,
                 block_table: list[int] | torch.Tensor, kv_head: int, block_n: int,
                 softmax_scale: float | None = None) -> None:
        if q.dim() != 1:
            raise ValueError(f"q must be one query head's vector [head_dim], got shape {tuple(q.shape)}")
        if k_cache.dim() != 4 or k_cache.shape != v_cache.shape:
            raise ValueError("k_cache and v_cache must both be [num_blocks, block_size, num_kv_heads, head_dim]")
        if k_cache.shape[3] != q.shape[0]:
            raise ValueError(f"q has head_dim {q.shape[0]} but the cache has {k_cache.shape[3]}")
        if not 0 <= kv_head < k_cache.shape[2]:
            raise ValueError(f"kv_head {kv_head} out of range for {k_cache.shape[2]} KV heads")
        if not isinstance(block_n, int) or block_n < 1:
            raise ValueError(f"block_n must be a positive int, got {block_n!r}")
        table = [int(b) for b in (block_table.tolist() if torch.is_tensor(block_table) else block_table)]
        block_size = k_cache.shape[1]
        if seqlen < 1 or seqlen > len(table) * block_size:
            raise ValueError(f"seqlen {seqlen} must be between 1 and {len(table) * block_size} for this block table")
        self.q = q.float()
        self.k_cache, self.v_cache = k_cache, v_cache
        self.seqlen, self.table, self.kv_head, self.block_n = seqlen, table, kv_head, block_n
        self.block_size = block_size
        self.scale = reference.resolve_softmax_scale(softmax_scale, q.shape[0])
        self.num_tiles = -(-seqlen // block_n)
        self._state = SoftmaxState(0, 0, None, (), float("-inf"), 0.0, 1.0, tuple(0.0 for _ in range(q.shape[0])))

    def state(self) -> SoftmaxState:
        return self._state

    def done(self) -> bool:
        return self._state.positions_done == self.seqlen

    def step(self) -> SoftmaxState:
        """Read the next tile of positions through the block table and update m, l and acc."""
        if self.done():
            raise ValueError("the whole context has been read; nothing left to step")
        s = self._state
        start = s.positions_done
        stop = min(start + self.block_n, self.seqlen)
        device = self.k_cache.device
        positions = torch.arange(start, stop, device=device)
        block_ids = torch.tensor([self.table[p // self.block_size] for p in positions.tolist()], device=device)
        rows = positions % self.block_size
        keys = self.k_cache[block_ids, rows, self.kv_head].float()  # [tile, head_dim]
        values = self.v_cache[block_ids, rows, self.kv_head].float()
        scores = keys @ self.q * self.scale
        m_new = max(s.m, float(scores.max()))
        alpha = math.exp(s.m - m_new)  # exp(-inf) = 0 before the first tile: nothing to rescale
        p = torch.exp(scores - m_new)
        l_new = s.l * alpha + float(p.sum())
        acc = torch.tensor(s.acc, device=device) * alpha + p @ values
        self._state = SoftmaxState(s.tiles_done + 1, stop, (start, stop), tuple(scores.tolist()), m_new, l_new,
                                   alpha, tuple(acc.tolist()))
        return self._state

    def run(self) -> SoftmaxState:
        while not self.done():
            self.step()
        return self._state


def paged_decode_online(q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor, cache_seqlens: torch.Tensor,
                        block_table: torch.Tensor, block_n: int, softmax_scale: float | None = None) -> torch.Tensor:
    """`paged_decode_attention` computed by `OnlineSoftmax` for every (sequence, query head)."""
    reference.check_decode_args(q, k_cache, v_cache, cache_seqlens, block_table)
    batch, num_heads, head_dim = q.shape
    group = num_heads // k_cache.shape[2]
    out = torch.empty(batch, num_heads, head_dim, dtype=torch.float32, device=q.device)
    for b in range(batch):
        for h in range(num_heads):
            walk = OnlineSoftmax(q[b, h], k_cache, v_cache, int(cache_seqlens[b]), block_table[b], h // group,
                                 block_n, softmax_scale)
            out[b, h] = torch.tensor(walk.run().output, device=q.device)
    return out.to(q.dtype)
