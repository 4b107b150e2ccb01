"""Why paging: KV memory reserved, used and wasted by two allocation schemes.

*Reserve-max* gives every request one contiguous stretch for `max_len` tokens up front, because
nobody knows how long the answer will be. *Paged* gives a request `ceil(len / block_size)`
fixed-size blocks, so the only waste is the unfilled tail of its last block (internal
fragmentation, at most `block_size - 1` tokens per request).

Lengths are counted in tokens whose K/V must be stored when the request finishes
(prompt + output). Multiply by `kv_bytes_per_token` for bytes.
"""

from __future__ import annotations

from collections.abc import Iterable
from collections.abc import Sequence as Seq
from dataclasses import dataclass

import numpy as np

from refimpl.validation import check_positive_int


@dataclass(frozen=True)
class RequestLengths:
    """Prompt and output lengths of a batch of requests (numpy int64 arrays of equal
    length)."""

    prompt_lens: np.ndarray
    output_lens: np.ndarray
    max_len: int

    @property
    def total_lens(self) -> np.ndarray:
        """Tokens each request stores in the KV cache when it finishes."""
        return self.prompt_lens + self.output_lens

    def __len__(self) -> int:
        return len(self.prompt_lens)


def sample_request_lengths(
    num_requests: int,
    *,
    max_len: int = 2048,
    prompt_median: float = 300.0,
    output_median: float = 150.0,
    sigma: float = 0.9,
    seed: int = 0,
) -> RequestLengths:
    """Draw a skewed, seeded request-length distribution, the usual shape of chat traffic.

    Prompt and output lengths are log-normal (many short requests, a long tail), rounded to at
    least one token; a request longer than `max_len` is drawn again, so the distribution is
    truncated at `max_len` rather than piled up at it.
    """
    num_requests = check_positive_int("num_requests", num_requests)
    max_len = check_positive_int("max_len", max_len)
    if max_len < 2:
        raise ValueError(
            f"max_len must be at least 2 (one prompt and one output token), got {max_len}"
        )
    if not (prompt_median > 0 and output_median > 0 and sigma >= 0):
        raise ValueError("prompt_median and output_median must be > 0 and sigma >= 0")
    if prompt_median + output_median > max_len:
        raise ValueError(
            f"prompt_median + output_median ({prompt_median + output_median}) must not exceed "
            f"max_len ({max_len})"
        )
    rng = np.random.default_rng(seed)
    prompts, outputs, kept = [], [], 0
    while kept < num_requests:
        p = np.maximum(
            np.rint(rng.lognormal(np.log(prompt_median), sigma, num_requests)), 1
        ).astype(np.int64)
        o = np.maximum(
            np.rint(rng.lognormal(np.log(output_median), sigma, num_requests)), 1
        ).astype(np.int64)
        ok = p + o <= max_len
        prompts.append(p[ok])
        outputs.append(o[ok])
        kept += int(ok.sum())
    prompt = np.concatenate(prompts)[:num_requests]
    output = np.concatenate(outputs)[:num_requests]
    return RequestLengths(prompt, output, max_len)


@dataclass(frozen=True)
class MemoryUse:
    """KV-cache memory of one allocation scheme, in tokens (token slots)."""

    scheme: str
    block_size: int | None
    reserved_tokens: int
    used_tokens: int

    @property
    def wasted_tokens(self) -> int:
        return self.reserved_tokens - self.used_tokens

    @property
    def waste_fraction(self) -> float:
        """Share of the reserved memory that holds no K/V."""
        return self.wasted_tokens / self.reserved_tokens if self.reserved_tokens else 0.0


def _lengths(total_lens: Iterable[int]) -> np.ndarray:
    lens = np.asarray(total_lens if isinstance(total_lens, np.ndarray) else list(total_lens))
    if lens.ndim != 1 or len(lens) == 0 or lens.dtype.kind not in "iu":
        raise ValueError("total_lens must be a non-empty 1-D list of integer request lengths")
    lens = lens.astype(np.int64)
    if (lens < 1).any():
        raise ValueError(f"every request length must be >= 1, got min {int(lens.min())}")
    return lens


def reserve_max_usage(total_lens: Iterable[int], max_len: int) -> MemoryUse:
    """Every request reserves `max_len` contiguous token slots, whatever it ends up using."""
    lens = _lengths(total_lens)
    max_len = check_positive_int("max_len", max_len)
    if (lens > max_len).any():
        raise ValueError(
            f"a request of {int(lens.max())} tokens does not fit max_len={max_len}"
        )
    return MemoryUse("reserve-max", None, len(lens) * max_len, int(lens.sum()))


def blocks_needed(total_lens: Iterable[int], block_size: int) -> np.ndarray:
    """Blocks per request: ceil(len / block_size), as `Sequence.num_blocks` computes it."""
    lens = _lengths(total_lens)
    block_size = check_positive_int("block_size", block_size)
    return (lens + block_size - 1) // block_size


def paged_usage(total_lens: Iterable[int], block_size: int) -> MemoryUse:
    """Every request holds whole blocks; only its last block can be partly empty."""
    lens = _lengths(total_lens)
    blocks = blocks_needed(lens, block_size)
    return MemoryUse("paged", block_size, int(blocks.sum()) * block_size, int(lens.sum()))


def compare_allocation(
    total_lens: Iterable[int], max_len: int, block_sizes: Seq[int]
) -> list[MemoryUse]:
    """Reserve-max first, then paged for each block size, all on the same requests."""
    lens = _lengths(total_lens)
    return [reserve_max_usage(lens, max_len)] + [paged_usage(lens, bs) for bs in block_sizes]


def requests_that_fit(
    total_lens: Iterable[int],
    budget_tokens: int,
    *,
    block_size: int | None = None,
    max_len: int | None = None,
) -> int:
    """How many requests, taken in order, can hold their KV at the same time in `budget_tokens`
    slots.

    Give exactly one of `max_len` (reserve-max: each request costs `max_len`) or `block_size`
    (paged: each request costs its blocks).
    """
    lens = _lengths(total_lens)
    budget_tokens = check_positive_int("budget_tokens", budget_tokens)
    if (block_size is None) == (max_len is None):
        raise ValueError("give exactly one of block_size (paged) or max_len (reserve-max)")
    if max_len is not None:
        cost = np.full(len(lens), check_positive_int("max_len", max_len), dtype=np.int64)
    else:
        cost = blocks_needed(lens, block_size) * block_size
    return int(np.searchsorted(np.cumsum(cost), budget_tokens, side="right"))


def kv_bytes_per_token(
    num_layers: int, num_kv_heads: int, head_dim: int, dtype_bytes: int = 2
) -> int:
    """Bytes of K plus V that one token occupies across all layers."""
    for name, v in (
        ("num_layers", num_layers),
        ("num_kv_heads", num_kv_heads),
        ("head_dim", head_dim),
        ("dtype_bytes", dtype_bytes),
    ):
        check_positive_int(name, v)
    return 2 * num_layers * num_kv_heads * head_dim * dtype_bytes


def format_memory_table(rows: Seq[MemoryUse], bytes_per_token: int | None = None) -> str:
    """A fixed-width table of the rows (and GiB when `bytes_per_token` is given)."""
    head = (
        f"{'scheme':<12} {'block':>5} {'reserved':>10} {'used':>10} {'wasted':>10} "
        f"{'waste %':>7}"
    )
    if bytes_per_token:
        head += f" {'reserved GiB':>12} {'wasted GiB':>10}"
    lines = [head]
    for r in rows:
        line = (
            f"{r.scheme:<12} {r.block_size if r.block_size else '-':>5} "
            f"{r.reserved_tokens:>10} "
            f"{r.used_tokens:>10} {r.wasted_tokens:>10} {100 * r.waste_fraction:>7.1f}"
        )
        if bytes_per_token:
            reserved_gib = r.reserved_tokens * bytes_per_token / 2**30
            wasted_gib = r.wasted_tokens * bytes_per_token / 2**30
            line += f" {reserved_gib:>12.2f} {wasted_gib:>10.2f}"
        lines.append(line)
    return "\n".join(lines)
