"""The course's running example for Part I: one shared system prompt and three users, A, B and
C.

Chapters 02-06 follow the same named requests so that a name in a table, a picture or a
timeline always means the same tokens. The prompts are made to show each mechanism at block
size 4:

- `SYSTEM`: an 8-token system prompt, exactly 2 full blocks, shared by everyone;
- A: the system prompt plus a 3-token question (11 tokens: 2 full blocks + 3 tokens);
- B: the system prompt plus a 5-token question (13 tokens: 3 full blocks + 1 token);
- C: the same prompt as A, sent again (a prefix hit on every full block A computed).

Token ids stand for words: they are small integers so a reader can see which request a block
holds (1xx: system prompt, 2xx: A's question, 3xx: B's question).
"""

from __future__ import annotations

from refimpl.paged.sequence import SamplingParams, Sequence

SYSTEM = [101, 102, 103, 104, 105, 106, 107, 108]
QUESTIONS = {"A": [201, 202, 203], "B": [301, 302, 303, 304, 305], "C": [201, 202, 203]}
NAMES = tuple(QUESTIONS)


def prompt(name: str) -> list[int]:
    """The token ids of user `name`'s prompt: the system prompt, then the question."""
    if name not in QUESTIONS:
        raise ValueError(f"the running example has users {', '.join(NAMES)}; got {name!r}")
    return SYSTEM + QUESTIONS[name]


def requests(
    block_size: int = 4, max_tokens: int = 4, names: tuple[str, ...] = NAMES
) -> dict[str, Sequence]:
    """Fresh `Sequence`s for the named users (greedy, `max_tokens` new tokens each), in name
    order."""
    params = SamplingParams(temperature=0.0, max_tokens=max_tokens, ignore_eos=True)
    return {name: Sequence(prompt(name), params, block_size=block_size) for name in names}


def names_by_seq_id(seqs: dict[str, Sequence]) -> dict[int, str]:
    """seq_id -> user name, so pictures and logs print "A" instead of a global counter
    value."""
    return {seq.seq_id: name for name, seq in seqs.items()}
