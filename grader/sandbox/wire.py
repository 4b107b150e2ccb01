"""What travels between the grader and the process that runs a student's code, and how.

The grader (the parent) trusts nothing the child sends. So the two directions differ:

- parent to child: pickled Python objects (the child trusts its parent; the arguments include
  spec objects such as `KVCacheGroupSpec`);
- child to parent: JSON only, with a tagged encoding of plain values (`encode` in the child,
  `decode` in the parent). Unpickling the child's bytes would run code the child chose inside
  the grader; JSON can only ever produce plain data. A frame that is too long, not JSON, or not
  in the expected shape is a `ProtocolError`, which fails the step like a wrong answer.

Each frame is a 4-byte big-endian length and the payload.
"""

from __future__ import annotations

import builtins
import json
import pickle
import re
import select
import socket
import struct
import time
from typing import Any

MAX_FRAME = 16 * 2**20  # bytes; a state of a few hundred fields is a few kB
# values in one encoded answer (a student's list may be long; it need not be endless)
MAX_ITEMS = 200_000
MAX_DEPTH = 40
MAX_TEXT = 2000  # characters kept of a repr or an exception message
_HEADER = struct.Struct(">I")


class ProtocolError(Exception):
    """The child sent something that is not a well-formed answer (or nothing at all)."""


class ChildGone(ProtocolError):
    """The child closed its end: it exited or was killed."""


# --- frames
def send_frame(sock: socket.socket, payload: bytes) -> None:
    sock.sendall(_HEADER.pack(len(payload)) + payload)


def recv_frame(sock: socket.socket, deadline: float | None, limit: int = MAX_FRAME) -> bytes:
    """One frame, waiting at most until `deadline` (time.monotonic()); TimeoutError after it.

    The wait is cut into short slices, so a time limit delivered as an asynchronous exception
    (the grader's watchdog off the main thread) still stops it.
    """
    header = _recv_exactly(sock, _HEADER.size, deadline)
    (length,) = _HEADER.unpack(header)
    if length > limit:
        raise ProtocolError(f"a frame of {length} bytes (at most {limit})")
    return _recv_exactly(sock, length, deadline)


def _recv_exactly(sock: socket.socket, n: int, deadline: float | None) -> bytes:
    chunks, left = [], n
    while left:
        wait = 0.2 if deadline is None else min(0.2, deadline - time.monotonic())
        if wait <= 0:
            raise TimeoutError("no answer in time")
        ready, _, _ = select.select([sock], [], [], wait)
        if not ready:
            continue
        chunk = sock.recv(min(left, 1 << 20))
        if not chunk:
            raise ChildGone("the connection closed")
        chunks.append(chunk)
        left -= len(chunk)
    return b"".join(chunks)


def send_request(sock: socket.socket, request: Any) -> None:
    """Parent to child: a pickled request."""
    send_frame(sock, pickle.dumps(request, protocol=pickle.HIGHEST_PROTOCOL))


def read_request(sock: socket.socket) -> Any:
    """Child side of `send_request` (the child trusts its parent)."""
    return pickle.loads(recv_frame(sock, None))


def send_answer(sock: socket.socket, answer: dict) -> None:
    """Child to parent: JSON (the parent decodes it with `read_answer`)."""
    send_frame(sock, json.dumps(answer, allow_nan=True).encode())


def read_answer(sock: socket.socket, deadline: float | None) -> dict:
    """Parent side: a JSON object from the child, or ProtocolError."""
    raw = recv_frame(sock, deadline)
    try:
        answer = json.loads(raw)
    except (ValueError, RecursionError) as exc:
        raise ProtocolError(f"an answer that is not JSON ({type(exc).__name__})") from None
    if not isinstance(answer, dict):
        raise ProtocolError(f"an answer that is a JSON {type(answer).__name__}, not an object")
    return answer


# --- values: encoding (child) and decoding (parent)
# Scalars are JSON scalars; everything else is a one-key object: {"l": [...]} list,
# {"t": [...]} tuple, {"s": [...]} set, {"f": [...]} frozenset, {"d": [[key, value], ...]}
# dict, {"o": [type name, repr]} an object that is not plain data, {"x": [type names, message]}
# an exception (the names of its classes, most derived first).
_ADDRESS = re.compile(r" at 0x[0-9a-fA-F]+")


def _short(text: str) -> str:
    text = _ADDRESS.sub("", text)
    return text if len(text) <= MAX_TEXT else text[: MAX_TEXT - 5] + " ..."


def encode(value: Any) -> Any:
    """A JSON-ready form of `value` (runs in the child, on whatever the student's code
    returned)."""
    budget = [MAX_ITEMS]
    return _encode(value, 0, budget)


def _encode(value: Any, depth: int, budget: list[int]) -> Any:
    budget[0] -= 1
    if budget[0] < 0 or depth > MAX_DEPTH:
        return {"o": ["...", "(too large to show)"]}
    if value is None or isinstance(value, bool):
        return value
    if isinstance(value, str):
        return str(value)
    if isinstance(value, int):
        return int(value)
    if isinstance(value, float):
        return float(value)
    if isinstance(value, BaseException):
        names = [klass.__name__ for klass in type(value).__mro__]
        return {"x": [names, _short(_safe_str(value))]}
    for kind, tag in ((list, "l"), (tuple, "t"), (frozenset, "f"), (set, "s")):
        if isinstance(value, kind):
            items = list(value)
            # the common case, rows of plain ints (block tables, free lists), in one pass
            if len(items) <= budget[0] and all(type(item) is int for item in items):
                budget[0] -= len(items)
                return {tag: items}
            return {tag: [_encode(item, depth + 1, budget) for item in items]}
    if isinstance(value, dict):
        return {
            "d": [
                [_encode(k, depth + 1, budget), _encode(v, depth + 1, budget)]
                for k, v in list(value.items())
            ]
        }
    index = getattr(type(value), "__index__", None)
    if index is not None:  # numpy integers and the like count as the int they stand for
        try:
            return int(index(value))
        except Exception:  # noqa: BLE001 - anything a student's type raises
            pass
    return {"o": [type(value).__name__, _short(_safe_repr(value))]}


def _safe_str(value: BaseException) -> str:
    try:
        return str(value)
    except Exception:  # noqa: BLE001
        return "(its message cannot be shown)"


def _safe_repr(value: Any) -> str:
    try:
        return repr(value)
    except Exception:  # noqa: BLE001
        return f"<{type(value).__name__} object>"


class Opaque:
    """A value from the student's side that is not plain data: equal to nothing, shown by its
    repr."""

    def __init__(self, type_name: str, text: str) -> None:
        self.type_name = type_name
        self.text = text

    def __eq__(self, other: object) -> bool:
        return False

    __hash__ = object.__hash__

    def __repr__(self) -> str:
        return self.text


def decode(data: Any) -> Any:
    """Plain Python values from `encode`'s output; ProtocolError for anything else."""
    try:
        return _decode(data, 0)
    except RecursionError:
        raise ProtocolError("an answer nested too deeply") from None


# what JSON gives for a scalar; `encode` writes every other value as a one-key dict
_SCALARS = frozenset({type(None), bool, int, float, str})


def _decode(data: Any, depth: int) -> Any:
    if depth > MAX_DEPTH + 2:
        raise ProtocolError("an answer nested too deeply")
    if data is None or isinstance(data, (bool, int, float, str)):
        return data
    if not (isinstance(data, dict) and len(data) == 1):
        raise ProtocolError(f"a value that is not in the grader's encoding: {str(data)[:60]}")
    ((tag, body),) = data.items()
    if tag in "ltsf" and isinstance(body, list):
        # the common case, rows of numbers (block tables, free lists): nothing to decode
        if all(type(item) in _SCALARS for item in body):
            items = body
        else:
            items = [_decode(item, depth + 1) for item in body]
        if tag in "sf":
            _require_hashable(items)
        return {"l": list, "t": tuple, "s": set, "f": frozenset}[tag](items)
    if (
        tag == "d"
        and isinstance(body, list)
        and all(isinstance(p, list) and len(p) == 2 for p in body)
    ):
        keys = [_decode(k, depth + 1) for k, _ in body]
        _require_hashable(keys)
        return dict(zip(keys, (_decode(v, depth + 1) for _, v in body)))
    if tag == "o" and _is_text_pair(body):
        return Opaque(body[0][:80], body[1][:MAX_TEXT])
    if (
        tag == "x"
        and isinstance(body, list)
        and len(body) == 2
        and isinstance(body[0], list)
        and isinstance(body[1], str)
    ):
        if not body[0] or not all(isinstance(name, str) for name in body[0]):
            raise ProtocolError("an exception without a type name")
        return student_exception(body[0], body[1])
    raise ProtocolError(
        f"a value tagged {str(tag)[:20]!r} that is not in the grader's encoding"
    )


def _is_text_pair(body: Any) -> bool:
    return isinstance(body, list) and len(body) == 2 and all(isinstance(x, str) for x in body)


def _require_hashable(items: list) -> None:
    for item in items:
        try:
            hash(item)
        except TypeError:
            raise ProtocolError(
                f"a set member or dict key that cannot be one ({type(item).__name__})"
            ) from None


_IDENTIFIER = re.compile(r"[^A-Za-z0-9_.]")
_EXCEPTION_CLASSES: dict[tuple[str, type], type] = {}


def student_exception(type_names: list[str], message: str) -> BaseException:
    """An exception standing for the one the student's code raised in the child.

    Its class has the student's class name and derives from the first built-in exception among
    the names (so `isinstance(e, ValueError)` holds for a student's ValueError subclass); its
    `str()` is the message as the child wrote it.
    """
    name = _IDENTIFIER.sub("_", type_names[0])[:80] or "Exception"
    base = next(
        (
            getattr(builtins, n)
            for n in type_names
            if isinstance(getattr(builtins, n, None), type)
            and issubclass(getattr(builtins, n), BaseException)
        ),
        Exception,
    )
    if base in (KeyboardInterrupt, SystemExit, GeneratorExit) or not issubclass(
        base, Exception
    ):
        base = Exception  # never let a decoded exception stop the grader itself
    klass = _EXCEPTION_CLASSES.get((name, base))
    if klass is None:
        klass = type(
            name,
            (base,),
            {
                "__module__": "student",
                "__str__": lambda self: self.args[0] if self.args else "",
            },
        )
        _EXCEPTION_CLASSES[(name, base)] = klass
    return klass(message[:MAX_TEXT])
