"""Write the Mooncake conversation slice that ships in refimpl/sched/data (reproducible).

    python benchmarks/make_trace_slice.py PATH/TO/conversation_trace.jsonl OUT.jsonl

A contiguous window of the trace holds almost no reuse (a conversation's next turn comes
minutes later), so the slice keeps whole conversations instead: conversations are drawn at
random (seed 0) until 100 requests are taken, and every turn of each is kept, as the original
lines, in the original order. A conversation is the requests that share their second block id
(the first is a prefix nearly every request shares); a request of one block is its own.
"""

from __future__ import annotations

import json
import random
import sys

TARGET = 100


def main(src: str, dst: str) -> None:
    lines = open(src).read().splitlines()
    keys = []
    for i, line in enumerate(lines):
        ids = json.loads(line)["hash_ids"]
        keys.append(ids[1] if len(ids) > 1 else ("single", i))
    conversations: dict = {}
    for i, k in enumerate(keys):
        conversations.setdefault(k, []).append(i)
    order = list(conversations)
    random.Random(0).shuffle(order)
    taken: set[int] = set()
    for k in order:
        if len(taken) >= TARGET:
            break
        taken.update(conversations[k])
    with open(dst, "w") as f:
        for i in sorted(taken):
            f.write(lines[i] + "\n")


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2])
