"""DeepSeek V4 index kernels: Triton against the torch twins, plus exact hand-computed cases
for the twins and the compressed slot mapping. Every test runs on ``kernel_device`` (the CPU
under Triton's interpreter, CUDA where the kernels compile), the twins included."""

import pytest
import torch

from refimpl.kernels import deepseek_v4 as tri
from refimpl.kernels import reference_v4 as ref
from refimpl.kernels.triton_setup import HAS_TRITON

needs_triton = pytest.mark.skipif(not HAS_TRITON, reason="Triton is not installed")


@pytest.fixture
def i32(kernel_device):
    """``i32(values)``: an int32 tensor on the kernels' device."""
    return lambda values: torch.tensor(values, dtype=torch.int32, device=kernel_device)


@pytest.fixture
def batch(i32, kernel_device):
    """Request 0: 10 tokens after the step, 3 new (positions 7, 8, 9); request 1: 7 tokens, 1
    new. Returns (query_start_loc, seq_lens, token_to_req_indices, is_valid_token,
    block_table)."""
    # row 4 is padding
    valid = torch.tensor([True, True, True, True, False], device=kernel_device)
    return (
        i32([0, 3, 4]),
        i32([10, 7]),
        i32([0, 0, 0, 1, 1]),
        valid,
        i32([[5, 6, 7], [8, 9, 0]]),
    )


def test_swa_twin_exact(batch):
    QSL, SEQ, T2R, VALID, BT = batch
    idx, lens = ref.compute_swa_indices_and_lens(
        QSL, SEQ, T2R, VALID, BT, block_size=4, window_size=6
    )
    # position 7 of request 0 reads positions 2..7: block 5 offsets 2,3 then block 6 offsets
    # 0..3
    assert idx[0].tolist() == [22, 23, 24, 25, 26, 27]
    assert idx[2].tolist() == [24, 25, 26, 27, 28, 29]
    assert idx[3].tolist() == [33, 34, 35, 36, 37, 38]  # request 1, position 6 -> 1..6
    assert idx[4].tolist() == [-1] * 6  # padding: all -1, length 0
    assert lens.tolist() == [6, 6, 6, 6, 0]


def test_swa_twin_short_prefix_pads_with_minus_one(kernel_device, i32):
    valid = torch.tensor([True, True], device=kernel_device)
    idx, lens = ref.compute_swa_indices_and_lens(
        i32([0, 2]), i32([2]), i32([0, 0]), valid, i32([[3]]), 4, 6
    )
    assert idx.tolist() == [[12, -1, -1, -1, -1, -1], [12, 13, -1, -1, -1, -1]]
    assert lens.tolist() == [1, 2]


def test_swa_twin_token_offset_skips_leading_rows(batch):
    QSL, SEQ, T2R, VALID, BT = batch
    # as in vLLM, is_valid_token and token_to_req_indices cover the whole batch and are read at
    # token t = row + token_offset (the prefill rows start after the decode tokens)
    full_idx, full_lens = ref.compute_swa_indices_and_lens(QSL, SEQ, T2R, VALID, BT, 4, 6)
    idx, lens = ref.compute_swa_indices_and_lens(
        QSL, SEQ, T2R, VALID, BT, 4, 6, token_offset=3
    )
    assert torch.equal(idx, full_idx[3:]) and torch.equal(lens, full_lens[3:])
    assert lens.tolist() == [6, 0] and idx[1].tolist() == [-1] * 6  # token 4 is padding
    # num_rows is the grid size: only the decode rows
    idx, lens = ref.compute_swa_indices_and_lens(QSL, SEQ, T2R, VALID, BT, 4, 6, num_rows=2)
    assert torch.equal(idx, full_idx[:2]) and lens.tolist() == [6, 6]
    with pytest.raises(ValueError, match="num_rows"):
        ref.compute_swa_indices_and_lens(
            QSL, SEQ, T2R, VALID, BT, 4, 6, token_offset=3, num_rows=3
        )


def test_topk_twin_exact(i32, batch):
    QSL, SEQ, T2R, VALID, BT = batch
    topk = i32([[0, 3, -1, 5], [1, 2, 9, -1], [-1, -1, -1, -1], [0, 1, 2, 3], [4, 5, 6, 7]])
    idx, lens = ref.compute_global_topk_indices_and_lens(topk, T2R, BT, 4, VALID)
    assert idx.tolist() == [
        [20, 23, -1, 25],
        [21, 22, 29, -1],
        [-1] * 4,
        [32, 33, 34, 35],
        [-1] * 4,
    ]
    assert lens.tolist() == [3, 3, 0, 4, 0]


def test_compressed_slot_mapping_ratio_4_and_128(kernel_device, i32):
    # one request, 300 tokens computed in one step; MLA table [7, 3] (256 tokens per block)
    qsl, seq, bt = i32([0, 300]), i32([300]), i32([[7, 3]])
    c4 = ref.compressed_slot_mapping(
        qsl, seq, bt, block_size=64, compress_ratio=4, num_tokens=304
    )
    written = (c4 >= 0).nonzero().flatten().tolist()
    assert written == list(range(3, 300, 4))  # positions 3, 7, 11, ...
    assert (
        c4[3].item() == 7 * 64 and c4[255].item() == 7 * 64 + 63 and c4[259].item() == 3 * 64
    )
    assert c4[300:].tolist() == [-1] * 4  # padding tail
    c128 = ref.compressed_slot_mapping(qsl, seq, bt, block_size=2, compress_ratio=128)
    assert (c128 >= 0).nonzero().flatten().tolist() == [127, 255]
    assert c128[127].item() == 7 * 2 and c128[255].item() == 7 * 2 + 1
    # a token whose own slot is -1 writes no compressed entry either
    own = torch.zeros(300, dtype=torch.int64, device=kernel_device)
    own[255] = -1
    c128 = ref.compressed_slot_mapping(qsl, seq, bt, 2, 128, slot_mapping=own)
    assert (c128 >= 0).nonzero().flatten().tolist() == [127]


def test_compressed_slot_mapping_decode_step(i32):
    # decode: request with 511 cached tokens computes position 511 (the 4th entry of block 1 at
    # ratio 128)
    out = ref.compressed_slot_mapping(
        i32([0, 1]), i32([512]), i32([[4, 9]]), block_size=2, compress_ratio=128
    )
    assert out.tolist() == [9 * 2 + 1]


def test_bad_inputs_are_value_errors(kernel_device, i32, batch):
    QSL, SEQ, T2R, VALID, BT = batch
    with pytest.raises(ValueError, match="query_start_loc"):
        ref.compute_swa_indices_and_lens(i32([0, 3]), SEQ, T2R, VALID, BT, 4, 6)
    with pytest.raises(ValueError, match="window_size"):
        ref.compute_swa_indices_and_lens(QSL, SEQ, T2R, VALID, BT, 4, 0)
    with pytest.raises(ValueError, match="int32 or int64"):
        ref.compute_global_topk_indices_and_lens(
            torch.zeros(2, 2, device=kernel_device), T2R, BT, 4, VALID
        )
    with pytest.raises(ValueError, match="num_tokens"):
        ref.compressed_slot_mapping(QSL, SEQ, BT, 2, 4, num_tokens=2)


def random_batch(gen, num_reqs, block_size, max_blocks, device):
    """A random batch drawn on the CPU (the same on every machine), returned on ``device``."""
    with torch.device("cpu"):
        batch = _random_batch(gen, num_reqs, block_size, max_blocks)
    return tuple(t.to(device) for t in batch)


def _random_batch(gen, num_reqs, block_size, max_blocks):
    q = torch.randint(1, 4, (num_reqs,), generator=gen)
    computed = torch.randint(0, block_size * (max_blocks - 1), (num_reqs,), generator=gen)
    seq = computed + q
    qsl = torch.cat([torch.zeros(1, dtype=torch.int64), q.cumsum(0)])
    t2r = torch.repeat_interleave(torch.arange(num_reqs), q)
    pad = 2
    t2r = torch.cat([t2r, torch.zeros(pad, dtype=torch.int64)])
    valid = torch.rand(t2r.numel(), generator=gen) < 0.8
    valid[-pad:] = False
    bt = torch.randint(1, 1000, (num_reqs, max_blocks), generator=gen)
    return qsl.int(), seq.int(), t2r.int(), valid, bt.int()


@needs_triton
@pytest.mark.parametrize("seed", range(4))
def test_swa_kernel_matches_twin(kernel_device, seed):
    gen = torch.Generator().manual_seed(seed)
    qsl, seq, t2r, valid, bt = random_batch(
        gen, 3, block_size=4, max_blocks=5, device=kernel_device
    )
    window = [3, 6, 8, 5][seed]
    a = tri.compute_swa_indices_and_lens(qsl, seq, t2r, valid, bt, 4, window)
    b = ref.compute_swa_indices_and_lens(qsl, seq, t2r, valid, bt, 4, window)
    assert torch.equal(a[0], b[0]) and torch.equal(a[1], b[1])
    assert a[0].dtype == torch.int32 and a[1].dtype == torch.int32
    offset = 1 + seed % 2  # the prefill variant: rows start after the first tokens
    c = tri.compute_swa_indices_and_lens(
        qsl, seq, t2r, valid, bt, 4, window, token_offset=offset
    )
    assert torch.equal(c[0], b[0][offset:]) and torch.equal(c[1], b[1][offset:])


@needs_triton
def test_swa_kernel_token_offset_and_exact_case(batch):
    QSL, SEQ, T2R, VALID, BT = batch
    idx, lens = tri.compute_swa_indices_and_lens(QSL, SEQ, T2R, VALID, BT, 4, 6)
    assert idx[0].tolist() == [22, 23, 24, 25, 26, 27] and lens.tolist() == [6, 6, 6, 6, 0]
    assert idx[4].tolist() == [-1] * 6
    a = tri.compute_swa_indices_and_lens(QSL, SEQ, T2R, VALID, BT, 4, 6, token_offset=3)
    b = ref.compute_swa_indices_and_lens(QSL, SEQ, T2R, VALID, BT, 4, 6, token_offset=3)
    assert torch.equal(a[0], b[0]) and torch.equal(a[1], b[1])
    # validity is read at the absolute token (token 4 is padding)
    assert a[1].tolist() == [6, 0]
    a = tri.compute_swa_indices_and_lens(
        QSL, SEQ, T2R, VALID, BT, 4, 6, token_offset=1, num_rows=2
    )
    assert torch.equal(a[0], idx[1:3]) and a[1].tolist() == [6, 6]


@needs_triton
@pytest.mark.parametrize("seed", range(4))
def test_topk_kernel_matches_twin(kernel_device, seed):
    gen = torch.Generator().manual_seed(100 + seed)
    num_tokens, k, bs, max_blocks = 5, [4, 7, 8, 3][seed], [64, 2, 4, 2][seed], 3
    with torch.device("cpu"):  # drawn on the CPU: the same numbers on every machine
        topk = torch.randint(-1, bs * max_blocks, (num_tokens, k), generator=gen).int()
        t2r = torch.randint(0, 2, (num_tokens,), generator=gen).int()
        bt = torch.randint(1, 500, (2, max_blocks), generator=gen).int()
        valid = torch.rand(num_tokens, generator=gen) < 0.7
    topk, t2r, bt, valid = (t.to(kernel_device) for t in (topk, t2r, bt, valid))
    a = tri.compute_global_topk_indices_and_lens(topk, t2r, bt, bs, valid)
    b = ref.compute_global_topk_indices_and_lens(topk, t2r, bt, bs, valid)
    assert torch.equal(a[0], b[0]) and torch.equal(a[1], b[1])
    assert all(row.tolist() == [-1] * k for row, v in zip(a[0], valid) if not v)


@pytest.mark.parametrize(
    "impl", [ref, pytest.param(tri, marks=needs_triton)], ids=["twin", "triton"]
)
def test_padding_rows_with_stale_request_ids_read_nothing(i32, batch, impl):
    QSL, SEQ, T2R, VALID, BT = batch
    # CUDA-graph padding rows may keep a request id from an earlier step, here one out of range
    t2r = i32([0, 0, 0, 1, 7])
    idx, lens = impl.compute_swa_indices_and_lens(QSL, SEQ, t2r, VALID, BT, 4, 6)
    assert idx[4].tolist() == [-1] * 6 and lens.tolist() == [6, 6, 6, 6, 0]
    topk = i32([[0, 1], [0, 1], [0, 1], [0, 1], [0, 1]])
    idx, lens = impl.compute_global_topk_indices_and_lens(topk, t2r, BT, 4, VALID)
    assert idx[4].tolist() == [-1, -1] and lens.tolist() == [2, 2, 2, 2, 0]


@needs_triton
def test_kernels_check_inputs_like_twins(kernel_device, i32, batch):
    QSL, SEQ, T2R, VALID, BT = batch
    with pytest.raises(ValueError, match="block_size"):
        tri.compute_global_topk_indices_and_lens(
            i32([[0]]), i32([0]), i32([[1]]), 0, torch.tensor([True], device=kernel_device)
        )
    no_tokens = torch.zeros((0, 4), dtype=torch.int32, device=kernel_device)
    idx, lens = tri.compute_global_topk_indices_and_lens(
        no_tokens, i32([]), BT, 4, torch.tensor([], dtype=torch.bool, device=kernel_device)
    )
    assert idx.shape == (0, 4) and lens.shape == (0,)
