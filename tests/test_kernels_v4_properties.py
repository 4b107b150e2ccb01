"""DeepSeek V4 index kernels, property-based: random valid batches agree with the torch twins,
and every kind of bad index is the same ValueError from kernel and twin, raised before any
launch.

The strategies build their batches on the CPU; a test that calls a kernel moves them to
``kernel_device`` (the CPU under Triton's interpreter, CUDA where the kernels compile)."""

from __future__ import annotations

from contextlib import contextmanager
from unittest import mock

import pytest
import torch
from hypothesis import assume, given, settings
from hypothesis import strategies as st

from refimpl.kernels import reference_v4 as ref
from refimpl.kernels.triton_setup import HAS_TRITON

if HAS_TRITON:
    from refimpl.kernels import deepseek_v4 as tri

needs_triton = pytest.mark.skipif(not HAS_TRITON, reason="Triton is not installed")
FEW = settings(max_examples=40)  # the interpreter needs ~20 ms per launch


def i32(values, device: str = "cpu") -> torch.Tensor:
    return torch.tensor(values, dtype=torch.int32, device=device)


def on(device: str, batch: dict) -> dict:
    """The batch with every tensor moved to ``device``."""
    return {k: v.to(device) if isinstance(v, torch.Tensor) else v for k, v in batch.items()}


@st.composite
def swa_batches(draw):
    """A valid batch for compute_swa_indices_and_lens (as a dict of its arguments)."""
    block_size = draw(st.sampled_from([1, 2, 4]))
    max_blocks = draw(st.integers(1, 4))
    capacity = block_size * max_blocks
    num_reqs = draw(st.integers(0, 3))
    query_lens = [draw(st.integers(0, min(3, capacity))) for _ in range(num_reqs)]
    seq_lens = [draw(st.integers(q, capacity)) for q in query_lens]
    qsl = [0]
    for q in query_lens:
        qsl.append(qsl[-1] + q)
    t2r, valid = [], []
    for r, q in enumerate(query_lens):
        for _ in range(q):
            # mostly valid
            ok = draw(st.booleans()) or draw(st.booleans()) or draw(st.booleans())
            t2r.append(r if ok else draw(st.integers(-3, 9)))
            valid.append(ok)
    for _ in range(draw(st.integers(0, 2))):  # padding rows with stale request ids
        t2r.append(draw(st.integers(-3, 9)))
        valid.append(False)
    num_tokens = len(t2r)
    token_offset = draw(st.integers(0, num_tokens))
    num_rows = draw(st.one_of(st.none(), st.integers(0, num_tokens - token_offset)))
    rows = max(num_reqs, 1)
    table = [[draw(st.integers(0, 50)) for _ in range(max_blocks)] for _ in range(rows)]
    return dict(
        query_start_loc=i32(qsl),
        seq_lens=i32(seq_lens),
        token_to_req_indices=i32(t2r),
        is_valid_token=torch.tensor(valid, dtype=torch.bool, device="cpu"),
        block_table=i32(table),
        block_size=block_size,
        window_size=draw(st.integers(1, 6)),
        token_offset=token_offset,
        num_rows=num_rows,
    )


@st.composite
def topk_batches(draw):
    """A valid batch for compute_global_topk_indices_and_lens (keyword arguments)."""
    block_size = draw(st.sampled_from([1, 2, 4, 64]))
    max_blocks = draw(st.integers(1, 3))
    capacity = block_size * max_blocks
    num_reqs = draw(st.integers(1, 3))
    with_lens = draw(st.booleans())
    lens = [draw(st.integers(0, capacity)) if with_lens else capacity for _ in range(num_reqs)]
    num_tokens = draw(st.integers(0, 5))
    k = draw(st.integers(0, 5))
    t2r, valid, rows = [], [], []
    for _ in range(num_tokens):
        ok = draw(st.booleans()) or draw(st.booleans())
        r = draw(st.integers(0, num_reqs - 1)) if ok else draw(st.integers(-3, 9))
        t2r.append(r)
        valid.append(ok)
        top = lens[r] if ok else capacity + 5  # padding rows may hold anything
        rows.append([draw(st.integers(-1, top - 1)) if top > 0 else -1 for _ in range(k)])
    table = [[draw(st.integers(0, 500)) for _ in range(max_blocks)] for _ in range(num_reqs)]
    return dict(
        topk_indices=i32(rows).reshape(num_tokens, k),
        token_to_req_indices=i32(t2r),
        block_table=i32(table),
        block_size=block_size,
        is_valid_token=torch.tensor(valid, dtype=torch.bool, device="cpu"),
        compressed_lens=i32(lens) if with_lens else None,
    )


def _swa(impl, b):
    return impl.compute_swa_indices_and_lens(**b)


def _topk(impl, b):
    args = dict(b)
    lens = args.pop("compressed_lens")
    return impl.compute_global_topk_indices_and_lens(**args, compressed_lens=lens)


# ---------------------------------------------------------------------- valid inputs: kernel
# == twin
@needs_triton
@FEW
@given(swa_batches())
def test_swa_kernel_agrees_with_twin_on_random_valid_batches(kernel_device, b):
    b = on(kernel_device, b)
    got, want = _swa(tri, b), _swa(ref, b)
    assert torch.equal(got[0], want[0]) and torch.equal(got[1], want[1])
    lens = want[1]
    assert bool(((lens >= 0) & (lens <= b["window_size"])).all())
    inside = torch.arange(b["window_size"], device=kernel_device)[None, :] < lens[:, None]
    assert bool((want[0][~inside] == -1).all()) and bool((want[0][inside] >= 0).all())


@needs_triton
@FEW
@given(topk_batches())
def test_topk_kernel_agrees_with_twin_on_random_valid_batches(kernel_device, b):
    b = on(kernel_device, b)
    got, want = _topk(tri, b), _topk(ref, b)
    assert torch.equal(got[0], want[0]) and torch.equal(got[1], want[1])
    assert torch.equal(want[1], (want[0] >= 0).sum(dim=1, dtype=torch.int32))


@given(swa_batches())
def test_swa_twin_window_is_the_last_positions_of_each_token(b):
    """Row of token t at position p: the slots of positions max(p - W + 1, 0) .. p, oldest
    first."""
    idx, lens = _swa(ref, b)
    qsl, seq, t2r, valid = (
        b[k].tolist()
        for k in ("query_start_loc", "seq_lens", "token_to_req_indices", "is_valid_token")
    )
    table, bs, w = b["block_table"].tolist(), b["block_size"], b["window_size"]
    for row in range(idx.shape[0]):
        t = row + b["token_offset"]
        if not valid[t]:
            assert lens[row] == 0 and idx[row].tolist() == [-1] * w
            continue
        r = t2r[t]
        p = seq[r] - (qsl[r + 1] - qsl[r]) + (t - qsl[r])
        positions = range(max(p - w + 1, 0), p + 1)
        assert idx[row].tolist()[: len(positions)] == [
            table[r][q // bs] * bs + q % bs for q in positions
        ]
        assert lens[row] == len(positions)


# ---------------------------------------------------------------------- invalid inputs: the
# same ValueError, no launch
SWA_FAULTS = {
    "request_id_past_batch": "token_to_req_indices",
    "negative_request_id": "token_to_req_indices",
    "token_outside_its_request": "token_to_req_indices",
    "seq_len_below_query_len": "seq_lens",
    "position_past_block_table": "block_table",
    "query_start_loc_decreases": "query_start_loc",
    "query_start_loc_not_from_0": "query_start_loc",
}


def _computed_valid_rows(b) -> list[int]:
    n = (
        b["token_to_req_indices"].numel() - b["token_offset"]
        if b["num_rows"] is None
        else b["num_rows"]
    )
    return [
        t for t in range(b["token_offset"], b["token_offset"] + n) if b["is_valid_token"][t]
    ]


def _break_swa(b, fault: str, data) -> bool:
    """Apply one fault in place; False when this batch has nothing the fault could break."""
    t2r, seq, qsl = b["token_to_req_indices"], b["seq_lens"], b["query_start_loc"]
    rows = _computed_valid_rows(b)
    num_reqs = seq.numel()
    query_lens = (qsl[1:] - qsl[:-1]).tolist()
    if fault in (
        "request_id_past_batch",
        "negative_request_id",
        "token_outside_its_request",
        "position_past_block_table",
    ):
        if not rows:
            return False
        t = data.draw(st.sampled_from(rows))
        r = int(t2r[t])
        if fault == "request_id_past_batch":
            t2r[t] = num_reqs + data.draw(st.integers(0, 5))
        elif fault == "negative_request_id":
            t2r[t] = -data.draw(st.integers(1, 5))
        elif fault == "token_outside_its_request":
            if num_reqs < 2:
                return False
            t2r[t] = data.draw(st.sampled_from([o for o in range(num_reqs) if o != r]))
        else:
            seq[r] = (
                b["block_table"].shape[1] * b["block_size"]
                + query_lens[r]
                + data.draw(st.integers(0, 3))
            )
        return True
    if fault == "seq_len_below_query_len":
        candidates = [r for r in range(num_reqs) if query_lens[r] > 0]
        if not candidates:
            return False
        r = data.draw(st.sampled_from(candidates))
        seq[r] = data.draw(st.integers(0, query_lens[r] - 1))
        return True
    if fault == "query_start_loc_decreases":
        if num_reqs == 0:
            return False
        r = data.draw(st.integers(0, num_reqs - 1))
        qsl[r + 1] = qsl[r] - data.draw(st.integers(1, 3))
        return True
    qsl += data.draw(st.integers(1, 3))  # query_start_loc_not_from_0
    return True


@contextmanager
def no_launch():
    """Fail if a Triton kernel is launched (or a kernel object touched) inside the block."""

    class NoLaunch:
        def __getitem__(self, grid):
            raise AssertionError("a kernel was launched although an index is out of range")

    with (
        mock.patch.object(tri, "_compute_swa_indices_and_lens_kernel", NoLaunch()),
        mock.patch.object(tri, "_compute_global_topk_indices_and_lens_kernel", NoLaunch()),
    ):
        yield


def _raises_same_value_error(call_kernel, call_twin, argument: str, inputs: dict) -> None:
    before = {k: v.clone() for k, v in inputs.items() if isinstance(v, torch.Tensor)}
    with pytest.raises(ValueError) as twin:
        call_twin()
    if HAS_TRITON:
        with no_launch(), pytest.raises(ValueError) as kernel:
            call_kernel()
        assert str(kernel.value) == str(twin.value)
    assert argument in str(twin.value), str(twin.value)
    for k, v in before.items():  # nothing was written to the caller's tensors
        assert torch.equal(inputs[k], v), k


@given(swa_batches(), st.sampled_from(sorted(SWA_FAULTS)), st.data())
def test_every_bad_swa_index_is_a_value_error_in_kernel_and_twin(
    kernel_device, b, fault, data
):
    assume(_break_swa(b, fault, data))
    b = on(kernel_device, b)
    _raises_same_value_error(lambda: _swa(tri, b), lambda: _swa(ref, b), SWA_FAULTS[fault], b)


TOPK_FAULTS = {
    "request_id_past_batch": "token_to_req_indices",
    "negative_request_id": "token_to_req_indices",
    "index_below_minus_1": "topk_indices",
    "index_past_block_table": "block_table",
    "index_past_compressed_len": "compressed_lens",
}


@given(topk_batches(), st.sampled_from(sorted(TOPK_FAULTS)), st.data())
def test_every_bad_topk_index_is_a_value_error_in_kernel_and_twin(
    kernel_device, b, fault, data
):
    rows = [i for i in range(b["topk_indices"].shape[0]) if b["is_valid_token"][i]]
    assume(rows and not (fault.startswith("index") and b["topk_indices"].shape[1] == 0))
    i = data.draw(st.sampled_from(rows))
    r = int(b["token_to_req_indices"][i])
    capacity = b["block_table"].shape[1] * b["block_size"]
    if fault == "request_id_past_batch":
        b["token_to_req_indices"][i] = b["block_table"].shape[0] + data.draw(st.integers(0, 5))
    elif fault == "negative_request_id":
        b["token_to_req_indices"][i] = -data.draw(st.integers(1, 5))
    else:
        j = data.draw(st.integers(0, b["topk_indices"].shape[1] - 1))
        if fault == "index_below_minus_1":
            b["topk_indices"][i, j] = -data.draw(st.integers(2, 9))
        elif fault == "index_past_block_table":
            b["topk_indices"][i, j] = capacity + data.draw(st.integers(0, 9))
            b["compressed_lens"] = None
        else:
            assume(
                b["compressed_lens"] is not None and int(b["compressed_lens"][r]) < capacity
            )
            b["topk_indices"][i, j] = data.draw(
                st.integers(int(b["compressed_lens"][r]), capacity - 1)
            )
    b = on(kernel_device, b)
    _raises_same_value_error(
        lambda: _topk(tri, b), lambda: _topk(ref, b), TOPK_FAULTS[fault], b
    )


# ---------------------------------------------------------------------- the cases the issue
# names, exactly
@pytest.fixture
def ints(kernel_device):
    """``ints(values)``: an int32 tensor on the kernels' device."""
    return lambda values: i32(values, kernel_device)


@pytest.fixture
def batch(ints, kernel_device):
    """(query_start_loc, seq_lens, token_to_req_indices, is_valid_token, block_table) of a
    fixed batch."""
    valid = torch.tensor([True, True, True, True, False], device=kernel_device)
    return (
        ints([0, 3, 4]),
        ints([10, 7]),
        ints([0, 0, 0, 1, 1]),
        valid,
        ints([[5, 6, 7], [8, 9, 0]]),
    )


@pytest.mark.parametrize(
    "impl", [ref, pytest.param("tri", marks=needs_triton)], ids=["twin", "triton"]
)
def test_named_bad_indices_raise_value_errors(batch, ints, impl):
    impl = tri if impl == "tri" else impl
    QSL, SEQ, T2R, VALID, BT = batch
    # 99: past request 1's 3 blocks of 4 entries
    topk = ints([[0, 1], [0, 1], [0, 1], [0, 99], [0, 1]])
    with pytest.raises(
        ValueError,
        match=r"topk_indices\[3, 1\] = 99 is past request 1's block_table \(3 blocks of 4 = 12 entries\)",
    ):
        impl.compute_global_topk_indices_and_lens(topk, T2R, BT, 4, VALID)
    with pytest.raises(
        ValueError,
        match=r"topk_indices\[0, 1\] = 5 is past request 0's 5 compressed entries \(compressed_lens\[0\]\)",
    ):
        impl.compute_global_topk_indices_and_lens(
            ints([[0, 5]] * 5), T2R, BT, 4, VALID, compressed_lens=ints([5, 12])
        )
    with pytest.raises(
        ValueError, match=r"token_to_req_indices\[3\] = 2 is not a request of this batch"
    ):
        impl.compute_global_topk_indices_and_lens(
            ints([[0, 1]] * 5), ints([0, 0, 0, 2, 1]), BT, 4, VALID
        )
    with pytest.raises(
        ValueError,
        match=r"token_to_req_indices\[3\] = 2 is not a request of this batch \(0 \.\. 1\)",
    ):
        impl.compute_swa_indices_and_lens(QSL, SEQ, ints([0, 0, 0, 2, 1]), VALID, BT, 4, 6)
    with pytest.raises(
        ValueError, match=r"position 12, past its block_table \(3 blocks of 4 = 12 positions\)"
    ):
        impl.compute_swa_indices_and_lens(QSL, ints([15, 7]), T2R, VALID, BT, 4, 6)


@pytest.mark.parametrize(
    "impl", [ref, pytest.param("tri", marks=needs_triton)], ids=["twin", "triton"]
)
def test_sliding_window_with_fewer_tokens_than_queries_is_an_error(batch, ints, impl):
    """seq_len counts the new tokens, so seq_len < query_len would put them at negative
    positions (both used to return a window length of -1). It is a ValueError; seq_len ==
    query_len (a request's first prefill) is the smallest valid case and starts at position
    0."""
    impl = tri if impl == "tri" else impl
    QSL, SEQ, T2R, VALID, BT = batch
    with pytest.raises(
        ValueError, match=r"seq_lens\[0\] = 2 is smaller than the request's 3 new tokens"
    ):
        impl.compute_swa_indices_and_lens(QSL, ints([2, 7]), T2R, VALID, BT, 4, 6)
    idx, lens = impl.compute_swa_indices_and_lens(QSL, ints([3, 7]), T2R, VALID, BT, 4, 6)
    assert lens.tolist() == [1, 2, 3, 6, 0]
    assert idx[2].tolist() == [20, 21, 22, -1, -1, -1]


@pytest.mark.parametrize(
    "impl", [ref, pytest.param("tri", marks=needs_triton)], ids=["twin", "triton"]
)
def test_a_batch_without_requests_is_all_padding(kernel_device, ints, impl):
    impl = tri if impl == "tri" else impl
    empty = torch.zeros((0, 2), dtype=torch.int32, device=kernel_device)
    padding = torch.tensor([False, False], device=kernel_device)
    idx, lens = impl.compute_swa_indices_and_lens(
        ints([0]), ints([]), ints([3, 0]), padding, empty, 4, 3
    )
    assert idx.tolist() == [[-1] * 3] * 2 and lens.tolist() == [0, 0]
    valid = torch.tensor([True], device=kernel_device)
    with pytest.raises(ValueError, match="token_to_req_indices"):
        impl.compute_swa_indices_and_lens(ints([0]), ints([]), ints([0]), valid, empty, 4, 3)


def test_compressed_slot_mapping_is_the_torch_function_and_checks_its_indices():
    import refimpl.kernels as kernels

    assert kernels.compressed_slot_mapping is ref.compressed_slot_mapping
    with pytest.raises(
        ValueError, match=r"seq_lens\[0\] = 1 is smaller than the request's 2 new tokens"
    ):
        ref.compressed_slot_mapping(i32([0, 2]), i32([1]), i32([[3]]), 2, 4)
    # 300 tokens at ratio 4 complete entries 0..74; one block of 64 entries holds only 0..63
    with pytest.raises(
        ValueError,
        match=r"request 0 writes compressed entry 74 .* past its block_table \(1 blocks of 64 entries\)",
    ):
        ref.compressed_slot_mapping(i32([0, 300]), i32([300]), i32([[7]]), 64, 4)
    with pytest.raises(ValueError, match="query_start_loc must start at 0"):
        ref.compressed_slot_mapping(i32([1, 3]), i32([5]), i32([[3]]), 2, 4)
    with pytest.raises(ValueError, match="num_tokens"):
        ref.compressed_slot_mapping(i32([0, 2]), i32([5]), i32([[3]]), 2, 4, num_tokens=2.5)
    with pytest.raises(ValueError, match="slot_mapping has 1 entries"):
        ref.compressed_slot_mapping(
            i32([0, 2]),
            i32([5]),
            i32([[3]]),
            2,
            4,
            slot_mapping=torch.zeros(1, dtype=torch.int64),
        )
    # a decode whose entry was completed by an earlier step writes nothing and needs no room
    assert ref.compressed_slot_mapping(
        i32([0, 1]), i32([129]), i32([[4]]), 2, 128
    ).tolist() == [-1]
