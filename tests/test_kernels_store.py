"""store_kvcache: Triton kernel, torch twin, and the engine's fast torch backend (which also
runs unchecked, as the engine's later layers call it), all on ``kernel_device`` (the CPU under
Triton's interpreter, CUDA where the kernels compile).

Both must write exactly token i's rows at slot_mapping[i], touch nothing else, skip slot -1,
follow the strides of non-contiguous inputs and caches, and reject bad input before writing.
"""

from __future__ import annotations

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

import refimpl.kernels as triton_kernels
from refimpl.kernels import reference, torch_backend

BOTH = [
    pytest.param(reference, id="torch"),
    pytest.param(triton_kernels, id="triton"),
    pytest.param(torch_backend, id="torch-backend"),
]
DTYPES = [torch.float32, torch.float16, torch.bfloat16]


def expected_cache(
    cache: torch.Tensor, rows: torch.Tensor, slot_mapping: torch.Tensor
) -> torch.Tensor:
    """The cache after the store, computed one token at a time."""
    out = cache.clone()
    block_size = cache.shape[1]
    for i, slot in enumerate(slot_mapping.tolist()):
        if slot != -1:
            out[slot // block_size, slot % block_size] = rows[i]
    return out


@st.composite
def store_cases(draw):
    num_blocks = draw(st.integers(1, 5))
    block_size = draw(st.integers(1, 6))
    num_slots = num_blocks * block_size
    slots = draw(
        st.lists(st.integers(0, num_slots - 1), max_size=min(num_slots, 10), unique=True)
    )
    skipped = draw(st.lists(st.booleans(), min_size=len(slots), max_size=len(slots)))
    return dict(
        num_blocks=num_blocks,
        block_size=block_size,
        num_kv_heads=draw(st.integers(1, 3)),
        head_dim=draw(st.sampled_from([1, 5, 8, 16])),
        slots=[-1 if skip else s for s, skip in zip(slots, skipped)],
        dtype=draw(st.sampled_from(DTYPES)),
        index_dtype=draw(st.sampled_from([torch.int32, torch.int64])),
        seed=draw(st.integers(0, 2**16)),
    )


def randn(gen: torch.Generator, *shape: int, dtype: torch.dtype, device: str) -> torch.Tensor:
    """Normal samples drawn on the CPU (the same on every machine), then put on ``device``."""
    return torch.randn(*shape, generator=gen, device="cpu").to(dtype).to(device)


@pytest.mark.parametrize("impl", BOTH)
@settings(max_examples=25)
@given(case=store_cases())
def test_store_writes_exactly_the_mapped_slots(kernel_device, impl, case):
    gen = torch.Generator().manual_seed(case["seed"])
    shape = (case["num_blocks"], case["block_size"], case["num_kv_heads"], case["head_dim"])
    k_cache = randn(gen, *shape, dtype=case["dtype"], device=kernel_device)
    v_cache = randn(gen, *shape, dtype=case["dtype"], device=kernel_device)
    num_tokens = len(case["slots"])
    # key and value sliced out of one fused [tokens, 2, heads, dim] projection: non-contiguous
    kv = randn(
        gen,
        num_tokens,
        2,
        case["num_kv_heads"],
        case["head_dim"],
        dtype=case["dtype"],
        device=kernel_device,
    )
    key, value = kv[:, 0], kv[:, 1]
    slot_mapping = torch.tensor(case["slots"], dtype=case["index_dtype"], device=kernel_device)
    want_k = expected_cache(k_cache, key, slot_mapping)
    want_v = expected_cache(v_cache, value, slot_mapping)
    impl.store_kvcache(key, value, k_cache, v_cache, slot_mapping)
    assert torch.equal(k_cache, want_k)
    assert torch.equal(v_cache, want_v)


@pytest.mark.parametrize("impl", BOTH)
def test_store_into_strided_cache_views(kernel_device, impl):
    """Caches that are views into one slab with a block stride larger than a block (as layouts
    produce)."""
    # [blocks, k|v, block_size, heads, dim]
    slab = torch.zeros(4, 2, 3, 2, 4, device=kernel_device)
    k_cache, v_cache = slab[:, 0], slab[:, 1]
    assert not k_cache.is_contiguous()
    key = torch.arange(3 * 2 * 4, dtype=torch.float32, device=kernel_device).view(3, 2, 4) + 1
    impl.store_kvcache(
        key, -key, k_cache, v_cache, torch.tensor([11, -1, 0], device=kernel_device)
    )
    assert torch.equal(slab[3, 0, 2], key[0]) and torch.equal(slab[3, 1, 2], -key[0])
    assert torch.equal(slab[0, 0, 0], key[2]) and torch.equal(slab[0, 1, 0], -key[2])
    # two tokens x (k and v) x heads x dim, nothing else
    assert int((slab != 0).sum()) == 4 * 2 * 4


@pytest.mark.parametrize("impl", BOTH)
@pytest.mark.parametrize("slots", [[], [-1, -1, -1]], ids=["no-tokens", "all-padding"])
def test_store_with_nothing_to_write(kernel_device, impl, slots):
    k_cache, v_cache = (
        torch.zeros(2, 4, 1, 8, device=kernel_device),
        torch.zeros(2, 4, 1, 8, device=kernel_device),
    )
    rows = torch.ones(len(slots), 1, 8, device=kernel_device)
    impl.store_kvcache(
        rows,
        rows,
        k_cache,
        v_cache,
        torch.tensor(slots, dtype=torch.int64, device=kernel_device),
    )
    assert not k_cache.any() and not v_cache.any()


# the bad arguments, built here and moved to the kernel's device in the test
with torch.device("cpu"):
    BAD_STORE_ARGS = [
        (dict(slot_mapping=torch.tensor([0, 8])), "[0, 8)"),
        (dict(slot_mapping=torch.tensor([0, -2])), "-1 (skip)"),
        (dict(slot_mapping=torch.tensor([3, 3])), "same slot twice"),
        (dict(slot_mapping=torch.tensor([0, 1, 2])), "3 entries but there are 2 tokens"),
        (dict(slot_mapping=torch.tensor([0.0, 1.0])), "int32 or int64"),
        (dict(key=torch.ones(2, 1, 8, dtype=torch.float16)), "dtype"),
        (dict(key=torch.ones(2, 2, 8)), "expected (2, 1, 8)"),
        (dict(value=torch.ones(2, 8)), "3-D"),
        (
            dict(
                k_cache=torch.zeros(2, 4, 1, 8, dtype=torch.float64),
                v_cache=torch.zeros(2, 4, 1, 8, dtype=torch.float64),
            ),
            "float32, float16, bfloat16",
        ),
        (dict(key="not a tensor"), "torch.Tensor"),
    ]


@pytest.mark.parametrize("impl", BOTH)
@pytest.mark.parametrize("change,message", BAD_STORE_ARGS)
def test_store_rejects_bad_input_before_writing(kernel_device, impl, change, message):
    with torch.device(kernel_device):
        args = dict(
            key=torch.ones(2, 1, 8),
            value=torch.ones(2, 1, 8),
            k_cache=torch.zeros(2, 4, 1, 8),
            v_cache=torch.zeros(2, 4, 1, 8),
            slot_mapping=torch.tensor([0, 1]),
        )
    args.update(
        {
            name: value.to(kernel_device) if isinstance(value, torch.Tensor) else value
            for name, value in change.items()
        }
    )
    with pytest.raises(ValueError) as info:
        impl.store_kvcache(**args)
    assert message in str(info.value)
    assert not args["k_cache"].any() and not args["v_cache"].any()


@settings(max_examples=25)
@given(case=store_cases())
def test_unchecked_fast_store_writes_exactly_the_mapped_slots(kernel_device, case):
    """check=False (the engine's later layers): the same writes, the slots reused when the very
    same slot_mapping comes again, recomputed for a new one."""
    gen = torch.Generator().manual_seed(case["seed"])
    shape = (case["num_blocks"], case["block_size"], case["num_kv_heads"], case["head_dim"])
    slot_mapping = torch.tensor(case["slots"], dtype=case["index_dtype"], device=kernel_device)
    # same object twice, then a new one
    for mapping in (slot_mapping, slot_mapping, slot_mapping.flip(0)):
        k_cache = randn(gen, *shape, dtype=case["dtype"], device=kernel_device)
        v_cache = randn(gen, *shape, dtype=case["dtype"], device=kernel_device)
        key = randn(
            gen, len(case["slots"]), *shape[2:], dtype=case["dtype"], device=kernel_device
        )
        want_k, want_v = (
            expected_cache(k_cache, key, mapping),
            expected_cache(v_cache, -key, mapping),
        )
        torch_backend.store_kvcache(key, -key, k_cache, v_cache, mapping, check=False)
        assert torch.equal(k_cache, want_k) and torch.equal(v_cache, want_v)


def test_triton_store_on_a_device_it_cannot_use():
    meta = dict(device="meta")
    with pytest.raises(ValueError, match="meta"):
        triton_kernels.store_kvcache(
            torch.ones(1, 1, 8, **meta),
            torch.ones(1, 1, 8, **meta),
            torch.zeros(1, 4, 1, 8, **meta),
            torch.zeros(1, 4, 1, 8, **meta),
            torch.tensor([-1], **meta),
        )


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
@pytest.mark.parametrize("dtype", DTYPES)
def test_compiled_store_matches_twin_on_cuda(dtype):
    gen = torch.Generator().manual_seed(0)
    num_blocks, block_size, heads, dim, tokens = 64, 16, 8, 128, 500
    slots = torch.randperm(num_blocks * block_size, generator=gen, device="cpu")[:tokens]
    slots[::7] = -1
    qkv = randn(gen, tokens, 3, heads, dim, dtype=dtype, device="cuda")
    caches = [
        randn(gen, num_blocks, block_size, heads, dim, dtype=dtype, device="cuda")
        for _ in range(2)
    ]
    caches += [c.clone() for c in caches]
    triton_kernels.store_kvcache(qkv[:, 1], qkv[:, 2], caches[0], caches[1], slots.cuda())
    reference.store_kvcache(qkv[:, 1], qkv[:, 2], caches[2], caches[3], slots.cuda())
    assert torch.equal(caches[0], caches[2]) and torch.equal(caches[1], caches[3])
