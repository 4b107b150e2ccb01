"""Sequence and SamplingParams: fields, block arithmetic at the boundaries, and compact
pickling."""

import math
import pickle

import pytest

from refimpl.paged import SamplingParams, Sequence, SequenceStatus


# --- fields
def test_new_sequence_fields():
    prompt = [11, 12, 13, 14, 15]
    params = SamplingParams(temperature=0.5, max_tokens=7, ignore_eos=True)
    seq = Sequence(prompt, params, block_size=4)
    assert seq.status is SequenceStatus.WAITING
    assert seq.token_ids == prompt
    assert seq.last_token == 15
    assert seq.num_tokens == len(seq) == 5
    assert seq.num_prompt_tokens == 5
    assert seq.num_cached_tokens == 0
    assert seq.num_scheduled_tokens == 0
    assert seq.is_prefill is True
    assert seq.block_table == []
    assert seq.block_size == 4
    # Sampling parameters are flattened onto the sequence, as in nano-vllm.
    assert (seq.temperature, seq.max_tokens, seq.ignore_eos) == (0.5, 7, True)


def test_default_sampling_params_and_block_size():
    seq = Sequence([1])
    assert seq.block_size == 256
    assert (seq.temperature, seq.max_tokens, seq.ignore_eos) == (1.0, 64, False)


def test_token_ids_are_copied_from_the_caller():
    prompt = [1, 2, 3]
    seq = Sequence(prompt, block_size=2)
    prompt.append(4)
    seq.append_token(9)
    assert prompt == [1, 2, 3, 4]
    assert seq.token_ids == [1, 2, 3, 9]


def test_any_iterable_is_accepted_as_prompt():
    seq = Sequence(range(3), block_size=2)
    assert seq.token_ids == [0, 1, 2]
    assert seq.last_token == 2


def test_seq_ids_increase_by_one():
    a, b, c = (Sequence([1], block_size=1) for _ in range(3))
    assert (b.seq_id - a.seq_id, c.seq_id - b.seq_id) == (1, 1)


def test_sequence_status_has_three_states():
    assert [s.name for s in SequenceStatus] == ["WAITING", "RUNNING", "FINISHED"]


# --- block arithmetic
@pytest.mark.parametrize(
    ("block_size", "num_tokens", "num_blocks", "last_block_num_tokens"),
    [
        (1, 1, 1, 1),
        (1, 2, 2, 1),
        (1, 7, 7, 1),
        (2, 1, 1, 1),
        (2, 2, 1, 2),
        (2, 3, 2, 1),
        (4, 1, 1, 1),
        (4, 3, 1, 3),
        (4, 4, 1, 4),
        (4, 5, 2, 1),
        (4, 8, 2, 4),
        (4, 9, 3, 1),
        (4, 12, 3, 4),
        (256, 1, 1, 1),
        (256, 255, 1, 255),
        (256, 256, 1, 256),
        (256, 257, 2, 1),
        (256, 512, 2, 256),
        (256, 600, 3, 88),
    ],
)
def test_num_blocks_and_last_block_num_tokens(
    block_size, num_tokens, num_blocks, last_block_num_tokens
):
    seq = Sequence(range(num_tokens), block_size=block_size)
    assert seq.num_blocks == num_blocks
    assert seq.last_block_num_tokens == last_block_num_tokens


@pytest.mark.parametrize("block_size", [1, 2, 3, 4, 16])
def test_block_arithmetic_agrees_with_ceil_for_every_length(block_size):
    seq = Sequence([0], block_size=block_size)
    for n in range(1, 5 * block_size + 2):
        assert seq.num_blocks == math.ceil(n / block_size)
        assert 1 <= seq.last_block_num_tokens <= block_size
        assert (seq.num_blocks - 1) * block_size + seq.last_block_num_tokens == n
        seq.append_token(n)


def test_block_returns_the_tokens_of_one_logical_block():
    seq = Sequence(range(10), block_size=4)
    assert seq.block(0) == [0, 1, 2, 3]
    assert seq.block(1) == [4, 5, 6, 7]
    assert seq.block(2) == [8, 9]  # the last block may be partly filled
    assert [seq.block(i) for i in range(seq.num_blocks)] == [
        [0, 1, 2, 3],
        [4, 5, 6, 7],
        [8, 9],
    ]


@pytest.mark.parametrize("index", [-1, 3, 100])
def test_block_out_of_range_is_a_value_error(index):
    seq = Sequence(range(10), block_size=4)
    with pytest.raises(ValueError, match="out of range"):
        seq.block(index)


def test_append_token_updates_tokens_last_token_and_length():
    seq = Sequence([5, 6, 7, 8], block_size=4)
    assert (seq.num_blocks, seq.last_block_num_tokens) == (1, 4)
    seq.append_token(42)
    assert seq.token_ids == [5, 6, 7, 8, 42]
    assert seq.last_token == 42
    assert seq.num_tokens == len(seq) == 5
    assert seq.num_prompt_tokens == 4  # the prompt length never changes
    assert (seq.num_blocks, seq.last_block_num_tokens) == (2, 1)  # crossed into a new block
    assert seq.prompt_token_ids == [5, 6, 7, 8]
    assert seq.completion_token_ids == [42]
    assert seq.num_completion_tokens == 1
    assert seq.block(1) == [42]


# --- SamplingParams
def test_sampling_params_defaults_and_greedy():
    assert SamplingParams() == SamplingParams(temperature=1.0, max_tokens=64, ignore_eos=False)
    assert SamplingParams(temperature=0).temperature == 0  # 0 means greedy and is allowed
    assert SamplingParams(max_tokens=1).max_tokens == 1


@pytest.mark.parametrize("temperature", [-0.1, -1, float("nan"), float("-inf")])
def test_sampling_params_rejects_bad_temperature(temperature):
    with pytest.raises(ValueError, match="temperature must be >= 0"):
        SamplingParams(temperature=temperature)


@pytest.mark.parametrize("max_tokens", [0, -3, 1.5, True, "8"])
def test_sampling_params_rejects_bad_max_tokens(max_tokens):
    with pytest.raises(ValueError, match="max_tokens must be an integer >= 1"):
        SamplingParams(max_tokens=max_tokens)


# --- compact pickling
def _roundtrip(seq):
    data = pickle.dumps(seq)
    return data, pickle.loads(data)


def test_prefill_pickle_sends_every_token():
    seq = Sequence(range(100, 110), block_size=4)
    seq.block_table = [3, 1, 4]
    seq.num_cached_tokens = 4
    seq.num_scheduled_tokens = 6
    _, copy = _roundtrip(seq)
    assert copy.is_prefill is True
    assert copy.token_ids == list(range(100, 110))
    assert copy.last_token == 109
    assert (copy.num_tokens, copy.num_prompt_tokens) == (10, 10)
    assert (copy.num_cached_tokens, copy.num_scheduled_tokens) == (4, 6)
    assert copy.block_table == [3, 1, 4]
    assert copy.block_size == 4
    assert copy.num_blocks == 3


def test_decode_pickle_sends_only_the_last_token():
    seq = Sequence(range(10), block_size=4)
    seq.block_table = [0, 1, 2]
    seq.append_token(77)
    seq.is_prefill = False
    seq.num_cached_tokens = 10
    seq.num_scheduled_tokens = 1
    _, copy = _roundtrip(seq)
    assert copy.is_prefill is False
    assert copy.token_ids == []  # the worker never sees the history
    assert copy.last_token == 77
    assert (copy.num_tokens, copy.num_prompt_tokens) == (11, 10)
    assert (copy.num_cached_tokens, copy.num_scheduled_tokens) == (10, 1)
    assert copy.block_table == [0, 1, 2]
    assert copy.num_blocks == 3  # derived from num_tokens, which still travels


def test_decode_pickle_is_smaller_and_does_not_grow_with_length():
    sizes = {}
    for num_tokens in (16, 4096):
        seq = Sequence(range(1000, 1000 + num_tokens), block_size=256)
        seq.block_table = list(range(seq.num_blocks))
        prefill_bytes = len(pickle.dumps(seq))
        seq.is_prefill = False
        decode_bytes = len(pickle.dumps(seq))
        sizes[num_tokens] = (prefill_bytes, decode_bytes)
        assert decode_bytes < prefill_bytes
    (short_prefill, short_decode), (long_prefill, long_decode) = sizes[16], sizes[4096]
    # A 4096-token prompt costs kilobytes to send in prefill ...
    assert long_prefill - short_prefill > 4000 * 2
    # ... while in decode only the block table grows (15 more block ids, a few bytes each).
    assert long_decode - short_decode < 15 * 4
    assert long_decode * 20 < long_prefill
