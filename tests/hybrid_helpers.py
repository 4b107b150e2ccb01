"""Small specs and block-id helpers shared by the hybrid allocator tests."""

from refimpl.hybrid.simulate import toy_full_spec, toy_window_spec


def full(bs=4):
    """A tiny full-attention spec with `bs` tokens per block."""
    return toy_full_spec(bs)


def swa(bs=4, window=8):
    """A tiny sliding-window spec with `bs` tokens per block and a `window`-token window."""
    return toy_window_spec(bs, window)


def ids(blocks):
    return [b.block_id for b in blocks]


def free_ids(pool):
    """The pool's free queue, head first, as block ids."""
    return ids(pool.free_block_queue.get_all_free_blocks())
