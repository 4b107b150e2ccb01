"""Literal restatements of nano-vllm's block manager and scheduler, and the workload strategies
that drive them next to refimpl's (Part I).

Nothing here imports a refimpl BlockManager or Scheduler: the oracles use deques and plain
dicts, so a difference in any order is a difference between refimpl and upstream.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass, field

from hypothesis import strategies as st

from refimpl.paged import SchedulerConfig, compute_hash


# --- the block manager
class OracleBlockManager:
    """nano-vllm's allocation rules written as plainly as possible, with a deque as the free
    queue.

    It keys block tables by seq_id and never looks at a BlockManager, so a difference in any
    order (which block comes from the head, where a freed block goes, which cache entry
    survives) shows up.
    """

    def __init__(self, num_blocks: int, block_size: int, caching: bool) -> None:
        self.block_size, self.caching = block_size, caching
        self.ref_count = [0] * num_blocks
        self.hash = [-1] * num_blocks
        self.tokens: list[list[int]] = [[] for _ in range(num_blocks)]
        self.cache: dict[int, int] = {}
        self.free = deque(range(num_blocks))
        self.used: set[int] = set()
        self.tables: dict[int, list[int]] = {}

    def _split(self, token_ids):
        bs = self.block_size
        return [token_ids[i : i + bs] for i in range(0, len(token_ids), bs)]

    def _hits(self, token_ids):
        hits, h = [], -1
        if self.caching:
            for block in self._split(token_ids)[:-1]:  # never the last block
                h = compute_hash(block, h)
                b = self.cache.get(h)
                if b is None or self.tokens[b] != block:
                    break  # the first miss ends the match
                hits.append(b)
        return hits

    def _needed(self, token_ids, hits):
        return len(self._split(token_ids)) - sum(b in self.used for b in hits)

    def can_allocate(self, token_ids) -> int:
        hits = self._hits(token_ids)
        return -1 if len(self.free) < self._needed(token_ids, hits) else len(hits)

    def _take_head(self) -> int:
        b = self.free.popleft()
        if self.hash[b] != -1 and self.cache.get(self.hash[b]) == b:
            del self.cache[self.hash[b]]
        self.ref_count[b], self.hash[b], self.tokens[b] = 1, -1, []
        self.used.add(b)
        return b

    def allocate(self, seq_id, token_ids, num_cached_blocks) -> bool:
        hits = self._hits(token_ids)
        if num_cached_blocks > len(hits):
            return False
        hits = hits[:num_cached_blocks]
        if len(self.free) < self._needed(token_ids, hits):
            return False
        table = []
        for b in hits:
            if b in self.used:
                self.ref_count[b] += 1
            else:
                self.ref_count[b] = 1
                self.free.remove(b)
                self.used.add(b)
            table.append(b)
        while len(table) < len(self._split(token_ids)):
            table.append(self._take_head())
        self.tables[seq_id] = table
        return True

    def deallocate(self, seq_id) -> None:
        for b in reversed(self.tables.pop(seq_id)):
            self.ref_count[b] -= 1
            if self.ref_count[b] == 0:
                self.used.remove(b)
                self.free.append(b)

    def _starts_block(self, num_tokens) -> bool:
        return (num_tokens - 1) % self.block_size == 0

    def can_append(self, num_tokens) -> bool:
        return len(self.free) >= self._starts_block(num_tokens)

    def may_append(self, seq_id, num_tokens) -> None:
        if self._starts_block(num_tokens):
            self.tables[seq_id].append(self._take_head())

    def hash_blocks(self, seq_id, token_ids, num_cached, num_scheduled) -> None:
        if not self.caching:
            return
        bs, table = self.block_size, self.tables[seq_id]
        start, end = num_cached // bs, (num_cached + num_scheduled) // bs
        h = self.hash[table[start - 1]] if start > 0 else -1
        for i in range(start, end):
            block = token_ids[i * bs : (i + 1) * bs]
            h = compute_hash(block, h)
            b = table[i]
            self.hash[b], self.tokens[b] = h, block
            self.cache[h] = b


# --- the scheduler
class LiteralBoundaryBlockManager(OracleBlockManager):
    """The oracle block manager with nano-vllm's literal `len % block_size == 1` boundary
    test."""

    def _starts_block(self, num_tokens) -> bool:
        return num_tokens % self.block_size == 1


@dataclass
class OracleSeq:
    seq_id: int
    token_ids: list[int]
    max_tokens: int
    ignore_eos: bool
    num_prompt_tokens: int = field(init=False)
    num_cached_tokens: int = 0
    num_scheduled_tokens: int = 0
    status: str = "WAITING"
    is_prefill: bool = True

    def __post_init__(self) -> None:
        self.num_prompt_tokens = len(self.token_ids)


class OracleScheduler:
    """nano-vllm's schedule / preempt / postprocess, line for line, over the oracle block
    manager."""

    def __init__(self, config: SchedulerConfig) -> None:
        self.config = config
        self.bs = config.kvcache_block_size
        self.bm = LiteralBoundaryBlockManager(
            config.num_kvcache_blocks, self.bs, config.enable_prefix_caching
        )
        self.waiting: deque[OracleSeq] = deque()
        self.running: deque[OracleSeq] = deque()

    def has_table(self, seq: OracleSeq) -> bool:
        return seq.seq_id in self.bm.tables

    def schedule(self) -> tuple[list[OracleSeq], bool]:
        scheduled_seqs: list[OracleSeq] = []
        num_batched_tokens = 0
        while self.waiting and len(scheduled_seqs) < self.config.max_num_seqs:
            seq = self.waiting[0]
            remaining = self.config.max_num_batched_tokens - num_batched_tokens
            if remaining == 0:
                break
            if not self.has_table(seq):
                num_cached_blocks = self.bm.can_allocate(seq.token_ids)
                if num_cached_blocks == -1:
                    break
                num_tokens = len(seq.token_ids) - num_cached_blocks * self.bs
            else:
                num_tokens = len(seq.token_ids) - seq.num_cached_tokens
            if remaining < num_tokens and scheduled_seqs:
                break
            if not self.has_table(seq):
                assert self.bm.allocate(seq.seq_id, seq.token_ids, num_cached_blocks)
                seq.num_cached_tokens = num_cached_blocks * self.bs
            seq.num_scheduled_tokens = min(num_tokens, remaining)
            num_batched_tokens += seq.num_scheduled_tokens
            if seq.num_cached_tokens + seq.num_scheduled_tokens == len(seq.token_ids):
                seq.status = "RUNNING"
                self.waiting.popleft()
                self.running.append(seq)
            scheduled_seqs.append(seq)
        if scheduled_seqs:
            return scheduled_seqs, True
        while self.running and len(scheduled_seqs) < self.config.max_num_seqs:
            seq = self.running.popleft()
            while not self.bm.can_append(len(seq.token_ids)):
                if self.running:
                    self.preempt(self.running.pop())
                else:
                    self.preempt(seq)
                    break
            else:
                seq.num_scheduled_tokens = 1
                seq.is_prefill = False
                self.bm.may_append(seq.seq_id, len(seq.token_ids))
                scheduled_seqs.append(seq)
        assert scheduled_seqs
        self.running.extendleft(reversed(scheduled_seqs))
        return scheduled_seqs, False

    def preempt(self, seq: OracleSeq) -> None:
        seq.status = "WAITING"
        seq.is_prefill = True
        self.bm.deallocate(seq.seq_id)
        seq.num_cached_tokens = 0
        self.waiting.appendleft(seq)

    def postprocess(
        self, seqs: list[OracleSeq], token_ids: list[int], is_prefill: bool
    ) -> None:
        for seq, token_id in zip(seqs, token_ids):
            self.bm.hash_blocks(
                seq.seq_id, seq.token_ids, seq.num_cached_tokens, seq.num_scheduled_tokens
            )
            seq.num_cached_tokens += seq.num_scheduled_tokens
            seq.num_scheduled_tokens = 0
            if is_prefill and seq.num_cached_tokens < len(seq.token_ids):
                continue
            seq.token_ids.append(token_id)
            completion = len(seq.token_ids) - seq.num_prompt_tokens
            if (
                not seq.ignore_eos and token_id == self.config.eos
            ) or completion == seq.max_tokens:
                seq.status = "FINISHED"
                self.bm.deallocate(seq.seq_id)
                seq.num_cached_tokens = 0
                self.running.remove(seq)


# --- workloads
# Prompts are a shared prefix plus a short random tail over a tiny alphabet, so full blocks
# repeat often, both after the same history (cache hits) and after different ones (same tokens,
# other hash).
PREFIXES = (
    (),
    (1, 2, 3, 4, 5, 6, 7, 8, 9),
    (1, 2, 3, 4, 9, 9, 9, 9, 9, 9),
    (0, 0, 0, 0, 0, 0, 0, 0),
)
TAIL = st.lists(st.integers(0, 3), max_size=6)
INDEX = st.integers(0, 1000)  # picks one of the candidates, modulo their number


VOCAB = 50
EOS = VOCAB  # outside the ordinary token range: only the runner's EOS rule produces it


@dataclass(frozen=True)
class Request:
    prompt: tuple[int, ...]
    max_tokens: int
    ignore_eos: bool
    arrival: int  # step before which it is added


@dataclass(frozen=True)
class Workload:
    block_size: int
    requests: tuple[Request, ...]
    eos_period: int | None

    def blocks_needed(self, request: Request) -> int:
        # the last sampled token is never computed
        longest = len(request.prompt) + request.max_tokens - 1
        return -(-longest // self.block_size)


@st.composite
def workloads(draw, block_sizes=(1, 2, 3, 4, 8)) -> Workload:
    block_size = draw(st.sampled_from(block_sizes))
    # a small alphabet: equal blocks, shared prefixes, hash-map overwrites
    tokens = st.integers(0, 12)
    prefixes = draw(st.lists(st.lists(tokens, max_size=12), min_size=1, max_size=3))
    requests = []
    for _ in range(draw(st.integers(1, 6))):
        prefix = draw(st.sampled_from(prefixes))
        tail = draw(st.lists(tokens, min_size=0 if prefix else 1, max_size=8))
        requests.append(
            Request(
                prompt=tuple(prefix + tail),
                max_tokens=draw(st.integers(1, 10)),
                ignore_eos=draw(st.booleans()),
                arrival=draw(st.integers(0, 6)),
            )
        )
    return Workload(block_size, tuple(requests), draw(st.sampled_from([None, 2, 5])))


@st.composite
def configs(draw, workload: Workload) -> SchedulerConfig:
    need = max(workload.blocks_needed(r) for r in workload.requests)
    return SchedulerConfig(
        num_kvcache_blocks=need + draw(st.integers(0, 6)),  # tight pools force preemption
        kvcache_block_size=workload.block_size,
        max_num_seqs=draw(st.integers(1, 6)),
        max_num_batched_tokens=draw(st.integers(1, 40)),  # small budgets force chunked prefill
        eos=EOS if workload.eos_period else -1,
        enable_prefix_caching=draw(st.booleans()),
    )
