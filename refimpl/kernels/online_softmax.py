"""The decode kernel's online softmax in plain torch, one tile at a time, so each step can be
looked at.

`_paged_decode_kernel` never holds a whole row of scores: it walks the context in tiles of
`BLOCK_N` positions, looking up each position's block in the block table, and keeps three
running values: the largest score so far `m`, the sum `l` of `exp(score - m)`, and the sum
`acc` of `exp(score - m) * v`. When a tile brings a larger score, what was summed under the old
maximum is rescaled by `alpha = exp(m_old - m_new)`. The answer is `acc / l`.

`OnlineSoftmax` runs that recurrence for one (sequence, query head) and exposes the state after
every tile; `paged_decode_online` runs it for every sequence and head and must equal the torch
twin `reference.paged_decode_attention` (and so the Triton kernel). The kernel works in base 2
(`exp2`, scores scaled by log2(e)); this module uses natural `exp`, which gives the same
numbers up to rounding.

Split-KV (flash-decoding) cuts the context into chunks walked by separate programs. Each chunk
ends with its own `Partial` (m, l, acc), and `merge_partials` combines two of them with the
very same rescaling a new tile gets: `chunk_partials` and `paged_decode_split` do in torch what
the split kernel and its merge kernel do, and must equal the twin too.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch

from refimpl.kernels import reference


@dataclass(frozen=True)
class SoftmaxState:
    """The running values after `tiles_done` tiles (positions `0 .. positions_done - 1`
    read)."""

    tiles_done: int
    # the next position to read (the walk started at its `start`, usually 0)
    positions_done: int
    tile: tuple[int, int] | None  # [start, stop) of the latest tile, None before the first
    tile_scores: tuple[float, ...]  # the latest tile's scaled scores q.k * scale
    m: float  # running max (-inf before the first tile)
    l: float  # running sum of exp(score - m)
    # the rescale factor the latest tile applied to l and acc (1.0 if m did not grow)
    alpha: float
    acc: tuple[float, ...]  # running sum of exp(score - m) * v, [head_dim]

    @property
    def output(self) -> tuple[float, ...]:
        """acc / l: the attention output if the context ended here."""
        if self.l == 0.0:
            return tuple(float("nan") for _ in self.acc)
        return tuple(a / self.l for a in self.acc)


class OnlineSoftmax:
    """One query against a paged context, walked tile by tile like `_paged_decode_kernel`.

    With `start` the walk reads only positions `start .. seqlen - 1`: one chunk of a split
    context.
    """

    def __init__(
        self,
        q: torch.Tensor,
        k_cache: torch.Tensor,
        v_cache: torch.Tensor,
        seqlen: int,
        block_table: list[int] | torch.Tensor,
        kv_head: int,
        block_n: int,
        softmax_scale: float | None = None,
        start: int = 0,
    ) -> None:
        if q.dim() != 1:
            raise ValueError(
                f"q must be one query head's vector [head_dim], got shape {tuple(q.shape)}"
            )
        if k_cache.dim() != 4 or k_cache.shape != v_cache.shape:
            raise ValueError(
                "k_cache and v_cache must both be [num_blocks, block_size, num_kv_heads, "
                "head_dim]"
            )
        if k_cache.shape[3] != q.shape[0]:
            raise ValueError(
                f"q has head_dim {q.shape[0]} but the cache has {k_cache.shape[3]}"
            )
        if not 0 <= kv_head < k_cache.shape[2]:
            raise ValueError(f"kv_head {kv_head} out of range for {k_cache.shape[2]} KV heads")
        if not isinstance(block_n, int) or block_n < 1:
            raise ValueError(f"block_n must be a positive int, got {block_n!r}")
        table = [
            int(b)
            for b in (block_table.tolist() if torch.is_tensor(block_table) else block_table)
        ]
        block_size = k_cache.shape[1]
        if seqlen < 1 or seqlen > len(table) * block_size:
            raise ValueError(
                f"seqlen {seqlen} must be between 1 and {len(table) * block_size} for this "
                "block table"
            )
        if not isinstance(start, int) or not 0 <= start < seqlen:
            raise ValueError(f"start must be an int in [0, seqlen={seqlen}), got {start!r}")
        self.q = q.float()
        self.k_cache, self.v_cache = k_cache, v_cache
        self.seqlen, self.table, self.kv_head, self.block_n = seqlen, table, kv_head, block_n
        self.block_size = block_size
        self.scale = reference.resolve_softmax_scale(softmax_scale, q.shape[0])
        self.start = start
        self.num_tiles = -(-(seqlen - start) // block_n)
        self._state = SoftmaxState(
            0, start, None, (), float("-inf"), 0.0, 1.0, tuple(0.0 for _ in range(q.shape[0]))
        )

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
        block_ids = torch.tensor(
            [self.table[p // self.block_size] for p in positions.tolist()], device=device
        )
        rows = positions % self.block_size
        keys = self.k_cache[block_ids, rows, self.kv_head].float()  # [tile, head_dim]
        values = self.v_cache[block_ids, rows, self.kv_head].float()
        scores = keys @ self.q * self.scale
        m_new = max(s.m, float(scores.max()))
        # exp(-inf) = 0 before the first tile: nothing to rescale
        alpha = math.exp(s.m - m_new)
        p = torch.exp(scores - m_new)
        l_new = s.l * alpha + float(p.sum())
        acc = torch.tensor(s.acc, device=device) * alpha + p @ values
        self._state = SoftmaxState(
            s.tiles_done + 1,
            stop,
            (start, stop),
            tuple(scores.tolist()),
            m_new,
            l_new,
            alpha,
            tuple(acc.tolist()),
        )
        return self._state

    def run(self) -> SoftmaxState:
        while not self.done():
            self.step()
        return self._state


def each_query_head(
    q: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    cache_seqlens: torch.Tensor,
    block_table: torch.Tensor,
    head_output,
) -> torch.Tensor:
    """A decode output built one (sequence, query head) at a time: ``head_output(q_vector,
    seqlen, block_table_row, kv_head)`` returns that head's output numbers."""
    reference.check_decode_args(q, k_cache, v_cache, cache_seqlens, block_table)
    batch, num_heads, head_dim = q.shape
    group = num_heads // k_cache.shape[2]
    out = torch.empty(batch, num_heads, head_dim, dtype=torch.float32, device=q.device)
    for b in range(batch):
        for h in range(num_heads):
            numbers = head_output(q[b, h], int(cache_seqlens[b]), block_table[b], h // group)
            out[b, h] = torch.tensor(numbers, device=q.device)
    return out.to(q.dtype)


def paged_decode_online(
    q: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    cache_seqlens: torch.Tensor,
    block_table: torch.Tensor,
    block_n: int,
    softmax_scale: float | None = None,
) -> torch.Tensor:
    """`paged_decode_attention` computed by `OnlineSoftmax` for every (sequence, query
    head)."""

    def walk(query, seqlen, table, kv_head):
        return (
            OnlineSoftmax(
                query, k_cache, v_cache, seqlen, table, kv_head, block_n, softmax_scale
            )
            .run()
            .output
        )

    return each_query_head(q, k_cache, v_cache, cache_seqlens, block_table, walk)


# --- split-KV: one partial result per chunk, then the merge


@dataclass(frozen=True)
class Partial:
    """What one split-KV program leaves for the merge: positions `start .. stop - 1` summed
    under their max `m`."""

    start: int
    stop: int
    m: float  # the chunk's largest score
    l: float  # sum of exp(score - m) over the chunk
    acc: tuple[float, ...]  # sum of exp(score - m) * v over the chunk

    @property
    def output(self) -> tuple[float, ...]:
        """acc / l: the chunk's own attention output (as if the context were only this
        chunk)."""
        return tuple(a / self.l for a in self.acc)


def merge_partials(a: Partial, b: Partial) -> Partial:
    """Two adjacent chunks as one: rescale each to the larger max, then add (the online-softmax
    step)."""
    if a.stop != b.start:
        raise ValueError(
            f"chunks {a.start}..{a.stop - 1} and {b.start}..{b.stop - 1} are not adjacent"
        )
    m = max(a.m, b.m)
    wa, wb = math.exp(a.m - m), math.exp(b.m - m)
    return Partial(
        a.start,
        b.stop,
        m,
        a.l * wa + b.l * wb,
        tuple(x * wa + y * wb for x, y in zip(a.acc, b.acc)),
    )


@dataclass(frozen=True)
class MergeState:
    """The merge after `count` of the chunks' `partials`: their combined `Partial`, and the
    rescale factors the latest step used."""

    partials: tuple[Partial, ...]
    count: int
    merged: Partial | None  # None before the first chunk
    # exp(m_old - m_new) for what was merged before, exp(m_chunk - m_new) for the chunk
    weights: tuple[float, float]


class PartialMerge:
    """The merge kernel's sum, one chunk at a time: what the split-KV programs left, combined
    left to right."""

    def __init__(self, partials: list[Partial]) -> None:
        if not partials:
            raise ValueError("PartialMerge needs at least one chunk's Partial")
        for left, right in zip(partials, partials[1:]):
            if left.stop != right.start:
                raise ValueError(
                    f"chunks {left.start}..{left.stop - 1} and "
                    f"{right.start}..{right.stop - 1} are not adjacent"
                )
        self.partials = tuple(partials)
        self._state = MergeState(self.partials, 0, None, (1.0, 1.0))

    def state(self) -> MergeState:
        return self._state

    def done(self) -> bool:
        return self._state.count == len(self.partials)

    def step(self) -> MergeState:
        """Merge the next chunk's partial result into the running one."""
        if self.done():
            raise ValueError("every chunk has been merged; nothing left to step")
        s = self._state
        chunk = self.partials[s.count]
        if s.merged is None:
            self._state = MergeState(self.partials, 1, chunk, (0.0, 1.0))
        else:
            m = max(s.merged.m, chunk.m)
            weights = (math.exp(s.merged.m - m), math.exp(chunk.m - m))
            self._state = MergeState(
                self.partials, s.count + 1, merge_partials(s.merged, chunk), weights
            )
        return self._state

    def run(self) -> MergeState:
        while not self.done():
            self.step()
        return self._state


def chunk_partials(
    q: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    seqlen: int,
    block_table: list[int] | torch.Tensor,
    kv_head: int,
    tokens_per_split: int,
    block_n: int,
    softmax_scale: float | None = None,
) -> list[Partial]:
    """One `Partial` per chunk of `tokens_per_split` positions, each walked tile by tile like a
    split program."""
    if not isinstance(tokens_per_split, int) or tokens_per_split < 1:
        raise ValueError(f"tokens_per_split must be a positive int, got {tokens_per_split!r}")
    partials = []
    for start in range(0, seqlen, tokens_per_split):
        stop = min(start + tokens_per_split, seqlen)
        state = OnlineSoftmax(
            q, k_cache, v_cache, stop, block_table, kv_head, block_n, softmax_scale, start
        ).run()
        partials.append(Partial(start, stop, state.m, state.l, state.acc))
    return partials


def paged_decode_split(
    q: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    cache_seqlens: torch.Tensor,
    block_table: torch.Tensor,
    tokens_per_split: int,
    block_n: int,
    softmax_scale: float | None = None,
) -> torch.Tensor:
    """`paged_decode_attention` the split-KV way: every chunk's `Partial`, merged left to
    right."""

    def split_and_merge(query, seqlen, table, kv_head):
        partials = chunk_partials(
            query,
            k_cache,
            v_cache,
            seqlen,
            table,
            kv_head,
            tokens_per_split,
            block_n,
            softmax_scale,
        )
        return PartialMerge(partials).run().merged.output

    return each_query_head(q, k_cache, v_cache, cache_seqlens, block_table, split_and_merge)
