"""What the hybrid allocator tests share (Part II): tiny specs, block-id views, one scheduler
step restated the way vLLM's scheduler drives `allocate_slots`, and the random-workload
strategy.
"""

from hypothesis import strategies as st

from refimpl.course.hybrid_simulate import toy_full_spec, toy_window_spec
from refimpl.hybrid.request import RequestStatus


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


def step(m, r, n, **kw):
    """Schedule n new tokens of r (after its hits) and mark them computed, as a scheduler
    would; None (and nothing changed) when they do not fit."""
    out = m.allocate_slots(r, n, **kw)
    if out is not None:
        r.num_computed_tokens += n + kw.get("num_new_computed_tokens", 0)
        r.status = RequestStatus.RUNNING
    return out


# --- workloads
# few symbols: many shared prefixes
prompt = st.lists(st.integers(0, 2), min_size=1, max_size=30)
action = st.one_of(
    st.tuples(st.just("add"), prompt),
    st.tuples(st.just("run"), st.integers(0, 9), st.integers(1, 12)),
    st.tuples(st.just("free"), st.integers(0, 9)),
)
