"""Paged decode / prefill attention: twins against dense attention, Triton kernels and the
engine's fast torch backend against twins.

The torch twins are proven against the textbook formula softmax(Q K^T * scale + causal mask) V
on contexts read token by token; the Triton kernels are then compared with the twins. Every
test runs on ``kernel_device`` (the CPU under Triton's interpreter, CUDA where the kernels
compile), the twins included; the random data is drawn on the CPU, so it is the same on every
machine. Every cache slot that is not part of some context is filled with NaN, so a kernel that
reads outside its context (a padded block-table entry, a row past the sequence end, an unused
block) produces NaN and fails.
"""

from __future__ import annotations

import functools
import itertools
import math

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

import refimpl.kernels as triton_kernels
from refimpl.kernels import paged_attention, reference, torch_backend

# (atol, rtol) between two fp32-accumulating implementations rounded to the dtype
TOLERANCE = {
    torch.float32: (2e-5, 2e-5),
    torch.float16: (2e-3, 2e-3),
    torch.bfloat16: (1.6e-2, 1.6e-2),
}
DTYPES = list(TOLERANCE)


# --- scenario


def make_paged_context(
    seq_lens: list[int],
    block_size: int,
    num_kv_heads: int,
    head_dim: int,
    dtype: torch.dtype = torch.float32,
    *,
    spare_blocks: int = 2,
    pad: int = -1,
    seed: int = 0,
    device: str,
):
    """A paged cache on ``device`` holding random contexts of the given lengths in shuffled
    blocks.

    Returns ``(k_cache, v_cache, block_table, cache_seqlens)``. Slots outside every context
    (spare blocks, the tail of each last block) hold NaN; block-table padding is ``pad``.
    """
    with torch.device("cpu"):  # drawn on the CPU: the same numbers on every machine
        gen = torch.Generator().manual_seed(seed)
        blocks_per_seq = [math.ceil(n / block_size) for n in seq_lens]
        num_blocks = sum(blocks_per_seq) + spare_blocks
        order = torch.randperm(num_blocks, generator=gen).tolist()
        width = max(blocks_per_seq, default=0) + 1  # one column of padding at least
        block_table = torch.full((len(seq_lens), width), pad, dtype=torch.int32)
        shape = (num_blocks, block_size, num_kv_heads, head_dim)
        k_cache = torch.full(shape, float("nan"))
        v_cache = torch.full(shape, float("nan"))
        for b, n in enumerate(seq_lens):
            for i in range(blocks_per_seq[b]):
                block_table[b, i] = order.pop()
            for t in range(n):
                block, row = int(block_table[b, t // block_size]), t % block_size
                k_cache[block, row] = torch.randn(num_kv_heads, head_dim, generator=gen)
                v_cache[block, row] = torch.randn(num_kv_heads, head_dim, generator=gen)
        seqlens = torch.tensor(seq_lens, dtype=torch.int32)
    return (
        k_cache.to(dtype).to(device),
        v_cache.to(dtype).to(device),
        block_table.to(device),
        seqlens.to(device),
    )


def randn(
    *shape: int, seed: int, device: str, dtype: torch.dtype = torch.float32
) -> torch.Tensor:
    """Seeded normal samples drawn on the CPU (the same on every machine), then put on
    ``device``."""
    gen = torch.Generator().manual_seed(seed)
    return torch.randn(*shape, generator=gen, device="cpu").to(dtype).to(device)


def on(device: str, *values):
    """Each tensor of ``values`` moved to ``device`` (other values unchanged)."""
    return [v.to(device) if isinstance(v, torch.Tensor) else v for v in values]


def context_rows(
    cache: torch.Tensor, block_table_row: torch.Tensor, length: int
) -> torch.Tensor:
    """Token by token, the slow obvious way: ``[length, num_kv_heads, head_dim]``."""
    block_size = cache.shape[1]
    rows = [
        cache[int(block_table_row[t // block_size]), t % block_size] for t in range(length)
    ]
    return torch.stack(rows) if rows else cache.new_zeros((0, *cache.shape[2:]))


def dense_attention(
    q: torch.Tensor, keys: torch.Tensor, values: torch.Tensor, scale: float
) -> torch.Tensor:
    """softmax(Q K^T * scale) V in float64, causal with queries aligned to the end of the
    keys."""
    group = q.shape[1] // keys.shape[1]
    keys = keys.double().repeat_interleave(group, dim=1)
    values = values.double().repeat_interleave(group, dim=1)
    scores = torch.einsum("qhd,khd->hqk", q.double(), keys) * scale
    q_len, k_len = q.shape[0], keys.shape[0]
    positions = torch.arange(k_len, device=q.device)
    causal = positions[None, :] <= positions[k_len - q_len :, None]
    scores = scores.masked_fill(~causal, float("-inf"))
    return torch.einsum("hqk,khd->qhd", scores.softmax(dim=-1), values)


def make_prefill_case(
    seq_lens,
    q_lens,
    block_size,
    num_kv_heads,
    group,
    head_dim,
    dtype,
    seed=0,
    pad=-1,
    *,
    device: str,
):
    k_cache, v_cache, block_table, _ = make_paged_context(
        seq_lens, block_size, num_kv_heads, head_dim, dtype, seed=seed, pad=pad, device=device
    )
    q = randn(
        sum(q_lens), num_kv_heads * group, head_dim, seed=seed + 1, dtype=dtype, device=device
    )
    cu_q = torch.tensor([0, *itertools.accumulate(q_lens)], dtype=torch.int32, device=device)
    cu_k = torch.tensor([0, *itertools.accumulate(seq_lens)], dtype=torch.int32, device=device)
    args = (q, k_cache, v_cache, cu_q, cu_k, max(q_lens), max(seq_lens), block_table)
    return args


def assert_close(actual: torch.Tensor, expected: torch.Tensor, dtype: torch.dtype) -> None:
    atol, rtol = TOLERANCE[dtype]
    assert actual.dtype == dtype
    assert torch.isfinite(actual).all()
    torch.testing.assert_close(actual.double(), expected.double(), atol=atol, rtol=rtol)


# --- strategies


@st.composite
def decode_cases(draw, max_len: int = 20):
    batch = draw(st.integers(1, 3))
    return dict(
        seq_lens=draw(st.lists(st.integers(1, max_len), min_size=batch, max_size=batch)),
        block_size=draw(st.integers(1, 6)),
        num_kv_heads=draw(st.integers(1, 2)),
        group=draw(st.sampled_from([1, 2, 4])),
        head_dim=draw(st.sampled_from([1, 3, 8, 12, 16])),
        dtype=draw(st.sampled_from(DTYPES)),
        pad=draw(st.sampled_from([-1, 0])),
        seed=draw(st.integers(0, 2**16)),
    )


@st.composite
def prefill_cases(draw, max_len: int = 20):
    case = draw(decode_cases(max_len))
    case["q_lens"] = [draw(st.integers(1, n)) for n in case["seq_lens"]]
    return case


def run_decode(impl, case, device):
    k_cache, v_cache, block_table, seqlens = make_paged_context(
        case["seq_lens"],
        case["block_size"],
        case["num_kv_heads"],
        case["head_dim"],
        case["dtype"],
        seed=case["seed"],
        pad=case["pad"],
        device=device,
    )
    num_heads = case["num_kv_heads"] * case["group"]
    q = randn(
        len(case["seq_lens"]),
        num_heads,
        case["head_dim"],
        seed=case["seed"] + 1,
        dtype=case["dtype"],
        device=device,
    )
    return (
        q,
        k_cache,
        v_cache,
        block_table,
        seqlens,
        impl(q, k_cache, v_cache, seqlens, block_table),
    )


def run_prefill(impl, case, device):
    args = make_prefill_case(
        case["seq_lens"],
        case["q_lens"],
        case["block_size"],
        case["num_kv_heads"],
        case["group"],
        case["head_dim"],
        case["dtype"],
        seed=case["seed"],
        pad=case["pad"],
        device=device,
    )
    return args, impl(*args)


# --- twins vs dense


@given(decode_cases())
def test_reference_decode_matches_dense_attention(kernel_device, case):
    q, k_cache, v_cache, block_table, seqlens, out = run_decode(
        reference.paged_decode_attention, case, kernel_device
    )
    scale = case["head_dim"] ** -0.5
    for b, n in enumerate(case["seq_lens"]):
        keys, values = (
            context_rows(k_cache, block_table[b], n),
            context_rows(v_cache, block_table[b], n),
        )
        expected = dense_attention(q[b : b + 1], keys, values, scale)[0]
        assert_close(out[b], expected, case["dtype"])


@given(prefill_cases())
def test_reference_prefill_matches_dense_causal_attention(kernel_device, case):
    args, out = run_prefill(reference.paged_prefill_attention, case, kernel_device)
    q, k_cache, v_cache, block_table = args[0], args[1], args[2], args[7]
    start = 0
    for b, (n, m) in enumerate(zip(case["seq_lens"], case["q_lens"])):
        keys, values = (
            context_rows(k_cache, block_table[b], n),
            context_rows(v_cache, block_table[b], n),
        )
        expected = dense_attention(
            q[start : start + m], keys, values, case["head_dim"] ** -0.5
        )
        assert_close(out[start : start + m], expected, case["dtype"])
        start += m


def test_reference_decode_equals_last_row_of_prefill(kernel_device):
    """Decode is prefill with one query: the newest token's row of a full prefill."""
    args = make_prefill_case(
        [9, 4], [9, 4], 4, 2, 2, 8, torch.float32, seed=3, device=kernel_device
    )
    q, k_cache, v_cache, cu_q, cu_k, _, _, block_table = args
    full = reference.paged_prefill_attention(*args)
    last_rows = cu_q[1:].long() - 1
    decode = reference.paged_decode_attention(
        q[last_rows], k_cache, v_cache, cu_k[1:] - cu_k[:-1], block_table
    )
    torch.testing.assert_close(decode, full[last_rows])


def test_softmax_scale_is_used(kernel_device):
    args = make_prefill_case([5], [2], 2, 1, 1, 4, torch.float32, seed=5, device=kernel_device)
    q, k_cache, v_cache, _, _, _, _, block_table = args
    keys, values = (
        context_rows(k_cache, block_table[0], 5),
        context_rows(v_cache, block_table[0], 5),
    )
    for impl in (reference.paged_prefill_attention, triton_kernels.paged_prefill_attention):
        out = impl(*args, softmax_scale=0.3)
        assert_close(out, dense_attention(q, keys, values, 0.3), torch.float32)


# --- the fast torch backend vs twins


def share_leading_blocks(
    block_table: torch.Tensor, seq_lens: list[int], block_size: int, columns: int
) -> None:
    """Point every row's first `columns` block-table entries at row 0's blocks (a shared cached
    prefix)."""
    columns = min(columns, min(seq_lens) // block_size)
    if columns:
        block_table[:, :columns] = block_table[0, :columns].clone()


@given(decode_cases(max_len=40), st.integers(0, 6))
def test_torch_backend_decode_matches_twin(kernel_device, case, shared_columns):
    """Including batches whose block tables start with the same blocks (attended once for
    all)."""
    k_cache, v_cache, block_table, seqlens = make_paged_context(
        case["seq_lens"],
        case["block_size"],
        case["num_kv_heads"],
        case["head_dim"],
        case["dtype"],
        seed=case["seed"],
        pad=case["pad"],
        device=kernel_device,
    )
    share_leading_blocks(block_table, case["seq_lens"], case["block_size"], shared_columns)
    q = randn(
        len(case["seq_lens"]),
        case["num_kv_heads"] * case["group"],
        case["head_dim"],
        seed=case["seed"] + 1,
        dtype=case["dtype"],
        device=kernel_device,
    )
    expected = reference.paged_decode_attention(q, k_cache, v_cache, seqlens, block_table)
    assert_close(
        torch_backend.paged_decode_attention(q, k_cache, v_cache, seqlens, block_table),
        expected,
        case["dtype"],
    )
    # A later layer of the same step: same metadata objects, unchecked, another layer's cache.
    k2, v2 = k_cache * 2, v_cache.flip(-1)
    assert_close(
        torch_backend.paged_decode_attention(q, k2, v2, seqlens, block_table, check=False),
        reference.paged_decode_attention(q, k2, v2, seqlens, block_table),
        case["dtype"],
    )


@given(prefill_cases(max_len=30))
def test_torch_backend_prefill_matches_twin(kernel_device, case):
    args, expected = run_prefill(reference.paged_prefill_attention, case, kernel_device)
    assert_close(torch_backend.paged_prefill_attention(*args), expected, case["dtype"])
    assert_close(
        torch_backend.paged_prefill_attention(*args, check=False), expected, case["dtype"]
    )


@pytest.mark.parametrize(
    "batched", [True, False], ids=["one-padded-batch", "one-sequence-at-a-time"]
)
def test_torch_backend_prefill_both_ways(kernel_device, monkeypatch, batched):
    """Small prefills run as one padded batch, large ones sequence by sequence: both equal the
    twin."""
    if not batched:
        monkeypatch.setattr(torch_backend, "BATCHED_PREFILL_MAX_SCORES", 0)
    args = make_prefill_case(
        [12, 5, 1, 9], [4, 5, 1, 0], 4, 2, 2, 8, torch.float32, seed=9, device=kernel_device
    )
    assert_close(
        torch_backend.paged_prefill_attention(*args),
        reference.paged_prefill_attention(*args),
        torch.float32,
    )


def test_unchecked_decode_recomputes_its_plan_for_new_metadata(kernel_device):
    """The plan is reused only for the very same metadata tensors: a new step gets its own."""
    k_cache, v_cache, block_table, seqlens = make_paged_context(
        [9, 5, 12], 4, 2, 8, seed=7, device=kernel_device
    )
    q = randn(3, 4, 8, seed=2, device=kernel_device)
    torch_backend.paged_decode_attention(q, k_cache, v_cache, seqlens, block_table)
    shorter, table = (
        torch.tensor([3, 5, 1], dtype=torch.int32, device=kernel_device),
        block_table.clone(),
    )
    share_leading_blocks(table, [9, 5, 12], 4, 1)
    for lens, bt in ((shorter, block_table), (seqlens, table)):
        got = torch_backend.paged_decode_attention(q, k_cache, v_cache, lens, bt, check=False)
        assert_close(
            got, reference.paged_decode_attention(q, k_cache, v_cache, lens, bt), torch.float32
        )


def test_gather_blocks_and_slots_copy_from_any_cache_view(kernel_device):
    # 5 blocks of 2
    cache = torch.arange(5 * 2 * 3 * 4, dtype=torch.float32, device=kernel_device).view(
        5, 2, 3, 4
    )
    ids = torch.tensor([[4, 0], [2, 2]], device=kernel_device)
    slots = torch.tensor([[9, 0, 3], [4, 4, 1]], device=kernel_device)
    by_slot = cache[slots // 2, slots % 2]
    assert torch.equal(torch_backend.gather_blocks(cache, ids), cache[ids])
    assert torch.equal(torch_backend.gather_slots(cache, slots), by_slot)
    # [blocks, k|v, ...]: a non-contiguous view per half
    slab = torch.stack((cache, -cache), dim=1)
    assert torch.equal(torch_backend.gather_blocks(slab[:, 1], ids), -cache[ids])
    assert torch.equal(torch_backend.gather_slots(slab[:, 1], slots), -by_slot)


# --- kernels vs twins


@pytest.mark.slow  # Triton interpreter
@settings(max_examples=15)
@given(decode_cases())
def test_triton_decode_matches_twin(kernel_device, case):
    *_, expected = run_decode(reference.paged_decode_attention, case, kernel_device)
    *_, actual = run_decode(triton_kernels.paged_decode_attention, case, kernel_device)
    assert_close(actual, expected, case["dtype"])


@pytest.mark.slow  # Triton interpreter
@settings(max_examples=15)
@given(prefill_cases(max_len=24))
def test_triton_prefill_matches_twin(kernel_device, case):
    _, expected = run_prefill(reference.paged_prefill_attention, case, kernel_device)
    _, actual = run_prefill(triton_kernels.paged_prefill_attention, case, kernel_device)
    assert_close(actual, expected, case["dtype"])


BOTH = [
    pytest.param(reference, id="torch"),
    pytest.param(torch_backend, id="torch-backend"),
    pytest.param(triton_kernels, id="triton", marks=pytest.mark.slow),  # Triton interpreter
]


@pytest.mark.parametrize("impl", BOTH)
@pytest.mark.parametrize("group", [1, 2, 4])
@pytest.mark.parametrize(
    "seq_lens,block_size",
    [([1], 4), ([8, 12], 4), ([5, 1, 7], 3), ([16], 16)],
    ids=["one-token", "multiple-of-block", "mixed", "one-full-block"],
)
def test_decode_edge_cases_against_dense(kernel_device, impl, group, seq_lens, block_size):
    """Context of 1 token, contexts that end exactly on a block boundary, GQA ratios 1/2/4."""
    k_cache, v_cache, block_table, seqlens = make_paged_context(
        seq_lens, block_size, 2, 8, seed=11, device=kernel_device
    )
    q = randn(len(seq_lens), 2 * group, 8, seed=1, device=kernel_device)
    out = impl.paged_decode_attention(q, k_cache, v_cache, seqlens, block_table)
    for b, n in enumerate(seq_lens):
        keys, values = (
            context_rows(k_cache, block_table[b], n),
            context_rows(v_cache, block_table[b], n),
        )
        assert_close(
            out[b], dense_attention(q[b : b + 1], keys, values, 8**-0.5)[0], torch.float32
        )


@pytest.mark.parametrize("impl", BOTH)
@pytest.mark.parametrize(
    "seq_lens,q_lens",
    [
        ([8], [8]),
        ([8], [1]),
        ([12, 5], [4, 5]),
        ([1, 9], [1, 3]),
        ([7, 6, 4], [0, 6, 2]),
        ([40], [33]),
    ],
    ids=[
        "full-prompt",
        "one-new-token",
        "cached-prefix",
        "one-token-seq",
        "empty-query-seq",
        "tiles",
    ],
)
def test_prefill_edge_cases_against_dense(kernel_device, impl, seq_lens, q_lens):
    """Cached prefixes (q_len < k_len), whole prompts, a sequence with no queries this step."""
    args = make_prefill_case(
        seq_lens, q_lens, 4, 1, 2, 8, torch.float32, seed=21, device=kernel_device
    )
    q, k_cache, v_cache, block_table = args[0], args[1], args[2], args[7]
    args = list(args)
    args[5] = max(q_lens)
    out = impl.paged_prefill_attention(*args)
    start = 0
    for b, (n, m) in enumerate(zip(seq_lens, q_lens)):
        keys, values = (
            context_rows(k_cache, block_table[b], n),
            context_rows(v_cache, block_table[b], n),
        )
        assert_close(
            out[start : start + m],
            dense_attention(q[start : start + m], keys, values, 8**-0.5),
            torch.float32,
        )
        start += m


@pytest.mark.parametrize("impl", BOTH)
def test_non_contiguous_query_and_cache_views(kernel_device, impl):
    """q sliced out of a fused QKV tensor and caches that are views into one larger slab."""
    seq_lens = [6, 3]
    k_cache, v_cache, block_table, seqlens = make_paged_context(
        seq_lens, 4, 2, 8, seed=4, pad=0, device=kernel_device
    )
    # [k|v, blocks, ...]
    slab = torch.full((2, k_cache.shape[0], 4, 2, 8), float("nan"), device=kernel_device)
    slab[0], slab[1] = k_cache, v_cache
    k_view, v_view = slab[0], slab[1]
    qkv = randn(2, 3, 4, 8, seed=0, device=kernel_device)
    q = qkv[:, 0]  # [batch, heads, dim], batch stride 96
    assert not q.is_contiguous()
    out = impl.paged_decode_attention(q, k_view, v_view, seqlens, block_table)
    expected = reference.paged_decode_attention(
        q.contiguous(), k_cache, v_cache, seqlens, block_table
    )
    assert_close(out, expected, torch.float32)


@pytest.mark.parametrize("impl", BOTH)
def test_empty_batch(kernel_device, impl):
    k_cache, v_cache, _, _ = make_paged_context([], 4, 1, 8, device=kernel_device)
    q = torch.zeros(0, 2, 8, device=kernel_device)
    out = impl.paged_decode_attention(
        q,
        k_cache,
        v_cache,
        torch.zeros(0, dtype=torch.int32, device=kernel_device),
        torch.zeros(0, 3, dtype=torch.int32, device=kernel_device),
    )
    assert out.shape == (0, 2, 8)


# --- errors


def _decode_args(device, **override):
    k_cache, v_cache, block_table, seqlens = make_paged_context(
        [5, 2], 4, 2, 8, seed=2, device=device
    )
    args = dict(
        q=randn(2, 4, 8, seed=0, device=device),
        k_cache=k_cache,
        v_cache=v_cache,
        cache_seqlens=seqlens,
        block_table=block_table,
    )
    args.update(
        {
            name: value.to(device) if isinstance(value, torch.Tensor) else value
            for name, value in override.items()
        }
    )
    return args


# the bad arguments, built here and moved to the kernel's device in the test
with torch.device("cpu"):
    BAD_DECODE_ARGS = [
        (dict(q=torch.randn(2, 3, 8)), "multiple of num_kv_heads"),
        (dict(q=torch.randn(2, 4, 6)), "head_dim"),
        (dict(q=torch.randn(2, 4, 8, dtype=torch.float64)), "dtype"),
        (dict(q=torch.randn(3, 4, 8)), "cache_seqlens has 2 entries"),
        (dict(cache_seqlens=torch.tensor([5, 0], dtype=torch.int32)), ">= 1"),
        (dict(cache_seqlens=torch.tensor([5.0, 2.0])), "int32 or int64"),
        (dict(cache_seqlens=torch.tensor([13, 2], dtype=torch.int32)), "does not fit"),
        (
            dict(block_table=torch.tensor([[0, -1, -1], [1, -1, -1]], dtype=torch.int32)),
            "block_table[0, 1]",
        ),
        (
            dict(block_table=torch.tensor([[0, 99, 0], [1, 0, 0]], dtype=torch.int32)),
            "block_table[0, 1] = 99",
        ),
        (dict(k_cache=torch.zeros(5, 4, 2, 8, dtype=torch.float16)), "dtypes"),
        (dict(v_cache=torch.zeros(5, 4, 2)), "4-D"),
        (dict(softmax_scale="big"), "softmax_scale"),
        (dict(num_splits=-1), "num_splits"),
        (dict(num_splits=2.0), "num_splits"),
    ]


@pytest.mark.parametrize("impl", BOTH)
@pytest.mark.parametrize("override,message", BAD_DECODE_ARGS)
def test_decode_rejects_bad_input(kernel_device, impl, override, message):
    args = _decode_args(kernel_device, **override)
    with pytest.raises(ValueError, match=None) as info:
        impl.paged_decode_attention(**args)
    assert message in str(info.value)


@pytest.mark.parametrize("impl", BOTH)
@pytest.mark.parametrize(
    "position,value,message",
    [
        (3, [0, 2, 3], "cu_seqlens_q ends at 3"),
        (4, [0, 1, 6], "only 1 keys"),
        (4, [1, 5, 6], "start at 0"),
        (5, 1, "max_seqlen_q"),
        (6, 3.5, "max_seqlen_k"),
        (4, [0, 5], "[batch + 1]"),
    ],
)
def test_prefill_rejects_bad_input(kernel_device, impl, position, value, message):
    args = list(
        make_prefill_case([5, 3], [2, 2], 4, 1, 1, 8, torch.float32, device=kernel_device)
    )
    args[position] = (
        torch.tensor(value, dtype=torch.int32, device=kernel_device)
        if isinstance(value, list)
        else value
    )
    with pytest.raises(ValueError) as info:
        impl.paged_prefill_attention(*args)
    assert message in str(info.value)


def test_triton_rejects_head_dim_above_256(kernel_device):
    k_cache, v_cache, block_table, seqlens = make_paged_context(
        [2], 2, 1, 264, device=kernel_device
    )
    q = randn(1, 1, 264, seed=0, device=kernel_device)
    with pytest.raises(ValueError, match="up to 256"):
        triton_kernels.paged_decode_attention(q, k_cache, v_cache, seqlens, block_table)
    # the torch twin has no such limit
    reference.paged_decode_attention(q, k_cache, v_cache, seqlens, block_table)


# --- compiled on CUDA


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize(
    "block_size,head_dim,group", [(16, 64, 1), (7, 96, 4), (256, 128, 2), (32, 256, 8)]
)
def test_compiled_attention_matches_twin_on_cuda(dtype, block_size, head_dim, group):
    seq_lens, q_lens = [1, 300, 77, 512], [1, 300, 13, 64]
    args = make_prefill_case(
        seq_lens, q_lens, block_size, 2, group, head_dim, dtype, seed=7, device="cuda"
    )
    atol, rtol = {
        torch.float32: (1e-4, 1e-4),
        torch.float16: (6e-3, 6e-3),
        torch.bfloat16: (4e-2, 4e-2),
    }[dtype]
    expected = reference.paged_prefill_attention(*args)
    actual = triton_kernels.paged_prefill_attention(*args)
    torch.testing.assert_close(actual.float(), expected.float(), atol=atol, rtol=rtol)
    q, k_cache, v_cache, block_table = args[0], args[1], args[2], args[7]
    seqlens = torch.tensor(seq_lens, dtype=torch.int32, device="cuda")
    dq = q[: len(seq_lens)].contiguous()
    expected = reference.paged_decode_attention(dq, k_cache, v_cache, seqlens, block_table)
    actual = triton_kernels.paged_decode_attention(dq, k_cache, v_cache, seqlens, block_table)
    torch.testing.assert_close(actual.float(), expected.float(), atol=atol, rtol=rtol)


# --- split-KV (flash-decoding)


@pytest.mark.parametrize(
    "programs,max_seqlen,expected",
    [
        (32 * 8, 2048, 3),  # batch 32 x 8 KV heads: 256 programs, 528 wanted on 132 SMs
        # few programs: as many chunks as 256-token pieces of the context allow
        (4 * 8, 2048, 8),
        (4 * 8, 100_000, 17),  # long context: enough chunks for 4 programs per SM
        (64 * 8, 512, 2),
        (600, 4096, 1),  # already 4 programs per SM
        (1, 10**6, 64),  # never more than MAX_SPLITS
        (8, 100, 1),  # a context shorter than two chunks of 256 tokens is not split
    ],
)
def test_num_kv_splits_fills_the_sms(programs, max_seqlen, expected):
    assert paged_attention.num_kv_splits(programs, max_seqlen, num_sms=132) == expected


@given(st.integers(1, 5000), st.integers(1, 200_000), st.integers(1, 200))
def test_num_kv_splits_bounds(programs, max_seqlen, num_sms):
    splits = paged_attention.num_kv_splits(programs, max_seqlen, num_sms)
    assert 1 <= splits <= paged_attention.MAX_SPLITS
    # split only when the programs do not fill the GPU, and never into tiny chunks
    if splits > 1:
        assert programs < paged_attention.PROGRAMS_PER_SM * num_sms
        assert max_seqlen // splits >= paged_attention.MIN_TOKENS_PER_SPLIT


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("head_dim", [1, 64, 96, 128, 256])
@pytest.mark.parametrize("group", [1, 4, 8, 64, 128])
def test_decode_tiles_fit_the_byte_budget(dtype, head_dim, group):
    block_g, block_n, block_d = paged_attention.decode_tiles(
        head_dim, group, dtype, interpret=False
    )
    assert min(block_g, block_n, block_d) >= 16  # tl.dot's smallest side
    assert all(x & (x - 1) == 0 for x in (block_g, block_n, block_d)) and block_d >= head_dim
    row_bytes = block_d * (4 if dtype == torch.float32 else 2)
    assert (block_g + 2 * block_n) * row_bytes <= paged_attention.DECODE_TILE_BYTES


@pytest.mark.slow  # Triton interpreter
@settings(max_examples=15)
@given(decode_cases(max_len=40), st.sampled_from([2, 3, 5, 64]))
def test_triton_split_decode_matches_twin(kernel_device, case, num_splits):
    *_, expected = run_decode(reference.paged_decode_attention, case, kernel_device)
    split = functools.partial(triton_kernels.paged_decode_attention, num_splits=num_splits)
    *_, actual = run_decode(split, case, kernel_device)
    assert_close(actual, expected, case["dtype"])


@pytest.mark.slow  # Triton interpreter
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("num_splits", [1, 4, 16])
@pytest.mark.parametrize("group", [1, 6, 32])
def test_triton_split_decode_edge_cases(kernel_device, dtype, num_splits, group):
    """Chunks that end inside a block (4 chunks of 12 tokens, 16 of 3), a 1-token context (its
    later chunks are empty), GQA groups that take one program (6) or two (32 query heads, 16
    per program here)."""
    seq_lens, block_size = [1, 17, 40], 3
    k_cache, v_cache, block_table, seqlens = make_paged_context(
        seq_lens, block_size, 2, 8, dtype, seed=13, device=kernel_device
    )
    q = randn(len(seq_lens), 2 * group, 8, seed=5, dtype=dtype, device=kernel_device)
    expected = reference.paged_decode_attention(q, k_cache, v_cache, seqlens, block_table)
    actual = triton_kernels.paged_decode_attention(
        q, k_cache, v_cache, seqlens, block_table, num_splits=num_splits
    )
    assert_close(actual, expected, dtype)


class CountLaunches:
    """Stands in for a Triton kernel object: counts `kernel[grid](...)` launches and passes
    them on."""

    def __init__(self, kernel):
        self.kernel, self.grids = kernel, []

    def __getitem__(self, grid):
        self.grids.append(grid)
        return self.kernel[grid]


@pytest.mark.slow  # Triton interpreter
def test_automatic_split_when_the_programs_do_not_fill_the_gpu(kernel_device, monkeypatch):
    """num_splits=0 on a GPU of 132 SMs: 2 sequences x 2 KV heads are 4 programs, so contexts
    of up to 600 tokens are cut into 2 chunks (two whole chunks of 256 tokens fit) and merged;
    the result is the twin's."""
    monkeypatch.setattr(paged_attention, "streaming_multiprocessors", lambda device: 132)
    decode = CountLaunches(paged_attention._paged_decode_kernel)
    merge = CountLaunches(paged_attention._merge_decode_splits_kernel)
    monkeypatch.setattr(paged_attention, "_paged_decode_kernel", decode)
    monkeypatch.setattr(paged_attention, "_merge_decode_splits_kernel", merge)
    k_cache, v_cache, block_table, seqlens = make_paged_context(
        [600, 250], 20, 2, 8, seed=3, device=kernel_device
    )
    # 30 blocks of 20: a capacity of 600 tokens, chunks of 300
    block_table = block_table[:, :30]
    q = randn(2, 4, 8, seed=4, device=kernel_device)
    actual = triton_kernels.paged_decode_attention(q, k_cache, v_cache, seqlens, block_table)
    assert decode.grids == [(2, 2, 2)] and merge.grids == [(2, 4)]
    assert_close(
        actual,
        reference.paged_decode_attention(q, k_cache, v_cache, seqlens, block_table),
        torch.float32,
    )
    triton_kernels.paged_decode_attention(
        q, k_cache, v_cache, seqlens, block_table, num_splits=1
    )
    assert decode.grids[-1] == (2, 2, 1) and len(merge.grids) == 1  # one chunk: no merge


def test_every_backend_takes_num_splits_and_ignores_it_in_torch(kernel_device):
    """flash-attn's `num_splits` is part of every decode signature; the torch versions give the
    same numbers."""
    k_cache, v_cache, block_table, seqlens = make_paged_context(
        [9, 4], 2, 2, 8, seed=8, device=kernel_device
    )
    q = randn(2, 4, 8, seed=9, device=kernel_device)
    for impl in (reference, torch_backend):
        assert torch.equal(
            impl.paged_decode_attention(
                q, k_cache, v_cache, seqlens, block_table, num_splits=5
            ),
            impl.paged_decode_attention(q, k_cache, v_cache, seqlens, block_table),
        )


def test_without_a_gpu_there_is_nothing_to_fill_and_no_split():
    """On a CPU the automatic choice never splits: the interpreter runs one program after
    another."""
    cpu = torch.device("cpu")
    assert paged_attention.streaming_multiprocessors(cpu) == 0
    q = torch.zeros(1, 1, 8, device="cpu")
    cache = torch.zeros(64, 16, 1, 8, device="cpu")
    # a capacity of 1024 tokens, one program
    table = torch.zeros(1, 64, dtype=torch.int32, device="cpu")
    assert paged_attention.split_plan(q, cache, table) == (1, 1024)
    assert paged_attention.split_plan(q, cache, table, num_splits=3) == (3, 342)
    # at most one chunk per token
    assert paged_attention.split_plan(q, cache, table, num_splits=5000) == (1024, 1)


@pytest.mark.parametrize("num_splits", [-1, 1.5, True, "2"])
def test_split_plan_refuses_what_flash_attn_refuses(num_splits):
    q = torch.zeros(1, 1, 8, device="cpu")
    cache = torch.zeros(64, 16, 1, 8, device="cpu")
    table = torch.zeros(1, 64, dtype=torch.int32, device="cpu")
    with pytest.raises(ValueError, match="num_splits must be an int >= 0"):
        paged_attention.split_plan(q, cache, table, num_splits=num_splits)
