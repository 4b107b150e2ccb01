"""Part I: nano-vllm's paged KV cache for one cache group.

Sequences own block tables; the BlockManager hands out physical blocks and runs the xxhash
prefix cache; the Scheduler decides each step's batch (prefill first, chunked prefill,
decode, preemption).
"""

from refimpl.errors import InvariantError
from refimpl.paged.block import Block
from refimpl.paged.block_manager import BlockManager
from refimpl.paged.free_queue import FreeBlockQueue
from refimpl.paged.hashing import compute_hash
from refimpl.paged.invariants import check_invariants
from refimpl.paged.scheduler import Scheduler, SchedulerConfig
from refimpl.paged.sequence import SamplingParams, Sequence, SequenceStatus

__all__ = [
    "Block",
    "BlockManager",
    "FreeBlockQueue",
    "InvariantError",
    "SamplingParams",
    "Scheduler",
    "SchedulerConfig",
    "Sequence",
    "SequenceStatus",
    "check_invariants",
    "compute_hash",
]
