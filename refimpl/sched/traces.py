"""Request traces to replay: the public Mooncake traces and a small JSONL format of our own.

A trace is a list of `TraceRequest`s in arrival order. Two formats are read (one per file,
told apart by the first line's keys):

- Mooncake (kvcache-ai/Mooncake, `FAST25-release/traces`, Apache-2.0): one JSON object per
  line with `timestamp` (ms from the start), `input_length`, `output_length` and `hash_ids`,
  one id per 512-token block of the prompt (the last block may be partial). Equal ids mean
  equal prefixes. The text itself is not published, so each id becomes 512 made-up token ids
  (see `mooncake_token_ids`): blocks with equal ids get equal tokens, and two prompts have
  equal token prefixes exactly as far as their ids agree.
- refimpl's JSONL: `timestamp` (ms), `output_length`, and the prompt either as
  `prompt_token_ids` (a list of ints) or as `segments`, a list of `[name, length]` pairs:
  segments with the same name are the same tokens, so a shared system prompt is written once
  by name (`[["system", 1200], ["user-7", 80]]`).

Every line is checked before any request is returned: a bad line gets a one-line ValueError
naming the file and the line, and the caller gets nothing half-read.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

#: Tokens per `hash_ids` entry in the Mooncake traces.
MOONCAKE_BLOCK_SIZE = 512
#: The slice of Mooncake's conversation trace that ships with refimpl (whole conversations).
SLICE_PATH = Path(__file__).parent / "data" / "mooncake_conversation_slice.jsonl"
#: sha256 of the shipped slice (also in data/README.md); `read_trace` checks it on load.
SLICE_SHA256 = "fdc1d8490f49b614f1f58a3c229798b73c7cefd694223a67853a48f739ffa13f"
# user segments get token ids from here up (a trace file is one format: Mooncake's made-up
# ids never meet them)
_SEGMENT_BASE = 1 << 40


@dataclass(frozen=True)
class TraceRequest:
    """One request of a trace: when it arrives, its prompt and how many tokens it generates.

    `hash_ids` are Mooncake's block ids (None for a JSONL trace); `prompt_token_ids` is built
    on demand, so a long trace holds only ids until a request is replayed."""

    request_id: str
    arrival_ms: float
    input_length: int
    output_length: int
    hash_ids: tuple[int, ...] | None = None
    token_ids: tuple[int, ...] | None = None

    @property
    def prompt_token_ids(self) -> list[int]:
        if self.token_ids is not None:
            return list(self.token_ids)
        return mooncake_token_ids(self.hash_ids, self.input_length)


#: The first id of a Mooncake block is this plus its block id; the filler ids are below it.
_MOONCAKE_FIRST_ID = 256
_MOONCAKE_FILLER = tuple(j % 256 for j in range(1, MOONCAKE_BLOCK_SIZE))
#: The largest block id whose first token id fits the int64 the prefix cache hashes.
MAX_MOONCAKE_HASH_ID = 2**63 - 1 - _MOONCAKE_FIRST_ID


def mooncake_token_ids(hash_ids: Iterable[int], input_length: int) -> list[int]:
    """512 made-up token ids per block id, cut to `input_length` (the last block partial).

    Block id `h` becomes the id `256 + h` followed by the same 511 filler ids in every block
    (1, 2, ..., 255, 0, 1, ...). The first id tells the blocks apart; the prefix cache hashes
    whole prefixes (each block's hash chains its parent's), so two prompts share cached blocks
    exactly as far as their block ids agree, as with ids distinct everywhere. CPython keeps
    one object for each int below 257, so a prompt costs 8 bytes a token instead of 40: a
    whole Mooncake trace replays in about 1.2 GB rather than 3.9 GB.
    """
    out: list[int] = []
    for h in hash_ids:
        out.append(_MOONCAKE_FIRST_ID + h)
        out.extend(_MOONCAKE_FILLER)
    del out[input_length:]  # in place: a long prompt is not copied again
    return out


# --- reading


def _fail(path, lineno: int, what: str) -> ValueError:
    return ValueError(f"{path}, line {lineno}: {what}")


def _int(d: dict, key: str, low: int, path, lineno: int) -> int:
    if key not in d:
        raise _fail(path, lineno, f"missing {key!r}")
    v = d[key]
    if isinstance(v, bool) or not isinstance(v, int):
        raise _fail(path, lineno, f"{key} must be an integer, got {v!r}")
    if v < low:
        raise _fail(path, lineno, f"{key} must be at least {low}, got {v}")
    return v


def _timestamp(d: dict, path, lineno: int, previous: float) -> float:
    v = d.get("timestamp")
    if isinstance(v, bool) or not isinstance(v, (int, float)) or v != v:
        raise _fail(path, lineno, f"timestamp must be a number of ms, got {v!r}")
    if v < 0:
        raise _fail(path, lineno, f"timestamp must be at least 0, got {v}")
    if v < previous:
        raise _fail(
            path,
            lineno,
            f"timestamp {v} is before the previous line's {previous}: "
            "a trace lists requests in arrival order",
        )
    return float(v)


def _mooncake_line(d: dict, path, lineno: int, arrival: float) -> TraceRequest:
    n = _int(d, "input_length", 1, path, lineno)
    out = _int(d, "output_length", 1, path, lineno)
    ids = d.get("hash_ids")
    if not isinstance(ids, list) or any(
        isinstance(h, bool) or not isinstance(h, int) or not 0 <= h <= MAX_MOONCAKE_HASH_ID
        for h in ids
    ):
        most = MAX_MOONCAKE_HASH_ID
        raise _fail(path, lineno, f"hash_ids must be a list of integers from 0 to {most}")
    need = -(-n // MOONCAKE_BLOCK_SIZE)
    if len(ids) != need:
        raise _fail(
            path,
            lineno,
            f"{len(ids)} hash_ids for input_length {n}; {MOONCAKE_BLOCK_SIZE}-"
            f"token blocks need {need}",
        )
    if len(set(ids)) != len(ids):
        dup = next(h for i, h in enumerate(ids) if h in ids[:i])
        raise _fail(path, lineno, f"hash id {dup} repeats inside the request")
    return TraceRequest(f"r{lineno - 1}", arrival, n, out, hash_ids=tuple(ids))


def _jsonl_line(d: dict, path, lineno: int, arrival: float, segments: dict) -> TraceRequest:
    out = _int(d, "output_length", 1, path, lineno)
    if ("prompt_token_ids" in d) == ("segments" in d):
        raise _fail(path, lineno, "give the prompt as prompt_token_ids or segments (one)")
    if "prompt_token_ids" in d:
        ids = d["prompt_token_ids"]
        if (
            not isinstance(ids, list)
            or not ids
            or any(
                isinstance(t, bool) or not isinstance(t, int) or not 0 <= t < _SEGMENT_BASE
                for t in ids
            )
        ):
            raise _fail(
                path,
                lineno,
                "prompt_token_ids must be a non-empty list of ints in [0, 2**40)",
            )
        tokens = tuple(ids)
    else:
        segs = d["segments"]
        if not isinstance(segs, list) or not segs:
            raise _fail(path, lineno, "segments must be a non-empty list of [name, length]")
        tokens = ()
        for seg in segs:
            if (
                not isinstance(seg, list)
                or len(seg) != 2
                or not isinstance(seg[0], str)
                or isinstance(seg[1], bool)
                or not isinstance(seg[1], int)
                or seg[1] < 1
            ):
                raise _fail(path, lineno, f"a segment is [name, length >= 1], got {seg!r}")
            name, length = seg
            start, known = segments.get(name, (None, None))
            if known is not None and known != length:
                raise _fail(
                    path,
                    lineno,
                    f"segment {name!r} has length {length} here and {known} "
                    "before; a name stands for the same tokens everywhere",
                )
            if start is None:
                start = _SEGMENT_BASE + sum(k for _, k in segments.values())
                segments[name] = (start, length)
            tokens += tuple(range(start, start + length))
    return TraceRequest(f"r{lineno - 1}", arrival, len(tokens), out, token_ids=tokens)


def parse_trace(lines: Iterable[str], path: str | Path = "<trace>") -> list[TraceRequest]:
    """The requests of a trace given as text lines (see the module doc); blank lines are
    skipped."""
    requests: list[TraceRequest] = []
    fmt = None
    previous = 0.0
    segments: dict[str, tuple[int, int]] = {}
    for lineno, line in enumerate(lines, 1):
        if not line.strip():
            continue
        try:
            d = json.loads(line)
        except json.JSONDecodeError as exc:
            raise _fail(path, lineno, f"not JSON ({exc.msg})") from None
        if not isinstance(d, dict):
            raise _fail(path, lineno, "each line must be a JSON object")
        line_fmt = "mooncake" if "hash_ids" in d else "jsonl"
        if fmt is None:
            fmt = line_fmt
        elif line_fmt != fmt:
            raise _fail(path, lineno, f"a {line_fmt} line in a {fmt} trace")
        previous = arrival = _timestamp(d, path, lineno, previous)
        if fmt == "mooncake":
            requests.append(_mooncake_line(d, path, lineno, arrival))
        else:
            requests.append(_jsonl_line(d, path, lineno, arrival, segments))
    if not requests:
        raise ValueError(f"{path}: the trace is empty (no requests)")
    return requests


def read_trace(path: str | Path, limit: int | None = None) -> list[TraceRequest]:
    """Read a trace file (Mooncake or refimpl JSONL); `limit` keeps the first requests.

    The shipped slice is checked against its sha256 first."""
    path = Path(path)
    if not path.is_file():
        raise ValueError(f"trace {str(path)!r} is not a file")
    data = path.read_bytes()
    if path.resolve() == SLICE_PATH.resolve():
        digest = hashlib.sha256(data).hexdigest()
        if digest != SLICE_SHA256:
            raise ValueError(f"{path}: sha256 {digest} is not the shipped slice's")
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError:
        raise ValueError(f"{path}: not UTF-8 text") from None
    requests = parse_trace(text.splitlines(), path)
    return requests if limit is None else requests[:limit]


# --- the infinite-cache upper bound


def prefix_hit_upper_bound(requests: Iterable[TraceRequest]) -> list[int]:
    """Per request, the prompt tokens an infinite prefix cache could serve: the longest
    prefix this prompt shares with some earlier request of the trace, at most
    `input_length - 1` (the last prompt token always runs, to give the next token's logits).

    For a Mooncake trace it is read straight from `hash_ids` (ids are prefix hashes: the run
    of leading ids seen before, a partial last block counted up to the longest length that id
    had before); for a JSONL trace it walks a token trie of the earlier prompts."""
    b = MOONCAKE_BLOCK_SIZE
    seen: dict[int, int] = {}  # hash id -> longest length (tokens) seen for its block
    trie: dict = {}
    out = []
    for r in requests:
        if r.hash_ids is not None:
            hit = 0
            for i, h in enumerate(r.hash_ids):
                length = min(b, r.input_length - i * b)
                if h not in seen:
                    break
                hit += min(length, seen[h])
                if seen[h] < length:
                    break
            for i, h in enumerate(r.hash_ids):
                seen[h] = max(seen.get(h, 0), min(b, r.input_length - i * b))
        else:
            node, hit, matching = trie, 0, True
            for t in r.token_ids:
                nxt = node.get(t)
                if nxt is None:
                    matching = False
                    nxt = node[t] = {}
                elif matching:
                    hit += 1
                node = nxt
        out.append(min(hit, r.input_length - 1))
    return out
