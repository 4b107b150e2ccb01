"""The grading child: runs a notebook's setup and solution cells, then only answers the
grader's calls.

`python -m grader` starts this module in a fresh process (`grader.sandbox.remote`) and
talks to it over a socket (`grader.sandbox.wire`). Before any student cell runs, the child
installs the finder that serves a refimpl without the exercise's answers
(`grader.exercises.answer_free`), lowers its resource limits and closes itself off
(`grader.sandbox.limits`); then it checks that it can read none of the reference's hidden
files, by any route, and refuses to run anything if it can.
Then it runs the cells and serves requests: build a world around the student's class or
function, apply a `Call` to it, report the world's state, enter or leave a patch. It never sees
the reference's answers and never decides whether anything passed; everything it sends back is
compared, by the grader, with the grader's own reference.
"""

from __future__ import annotations

import socket
import sys
from collections.abc import Callable
from contextlib import ExitStack
from typing import Any

from grader.sandbox import wire

NOT_DEFINED = "the notebook does not define it"


class _Discard:
    """Where the student's prints go while grading: nowhere (they are not part of the
    report)."""

    def write(self, text: str) -> int:
        return len(text)

    def flush(self) -> None:
        pass

    def isatty(self) -> bool:
        return False


def missing(target: str, reason: str) -> Callable[..., Any]:
    """Stands in for a name the notebook did not define: every use raises NameError with the
    reason."""

    def fail(*args: Any, **kwargs: Any) -> Any:
        raise NameError(f"{target} is not defined ({reason})")

    return type(target, (), {"__init__": fail}) if target[:1].isupper() else fail


def cell_problem(index: int, exc: BaseException) -> str:
    """Why a cell stopped, in the words a grade sheet needs."""
    if isinstance(exc, NotImplementedError):
        return f"not implemented (cell {index} raises NotImplementedError)"
    if isinstance(exc, SyntaxError):
        return f"syntax error in cell {index} (line {exc.lineno}: {exc.msg})"
    message = str(exc)
    return (
        f"cell {index} raised {type(exc).__name__}: {message}"
        if message
        else f"cell {index} raised {type(exc).__name__}"
    )


def run_cells(cells: list[tuple[int, str]]) -> tuple[dict, str | None]:
    """Run the cells in order in a fresh namespace; (namespace, why the first failing cell
    stopped)."""
    namespace: dict = {"__name__": "__main__"}
    for index, source in cells:
        try:
            exec(compile(source, f"<notebook cell {index}>", "exec"), namespace)
        # the student's code may raise anything, sys.exit included
        except BaseException as exc:  # noqa: BLE001
            return namespace, cell_problem(index, exc)
    return namespace, None


def _answer(run: Callable[[], Any], state: Callable[[], Any] | None) -> dict:
    """What the child sends back for one request: the result (and the world's state), or what
    stopped it."""
    from grader.exercises.answer_free import ReferenceUsed

    try:
        answer = {"ok": wire.encode(run())}
    except ReferenceUsed as used:
        return {"reference": used.qualified_name}
    # raised by the student's code, or by its result's methods
    except BaseException as exc:  # noqa: BLE001
        return {"raised": wire.encode(exc)}
    if state is not None:
        try:
            answer["state"] = wire.encode(state())
        except BaseException as exc:  # noqa: BLE001 - a missing field, a property that raises
            answer["state_error"] = wire.encode(exc)
    return answer


def serve(sock: socket.socket, namespace: dict, problem: str | None) -> None:
    """Answer requests until the grader says goodbye (or closes the socket)."""
    import grader.exercises.paged_worlds  # noqa: F401  (registers the worlds and contexts)
    from grader.lockstep.calls import CONTEXTS, build_world

    worlds: dict[str, Any] = {}
    contexts: dict[str, ExitStack] = {}
    while True:
        try:
            request = wire.read_request(sock)
        except wire.ChildGone:
            return
        kind = request[0]
        if kind == "bye":
            return
        if kind == "start":
            _, target, spec, want_state = request
            implementation = namespace.get(target) or missing(target, problem or NOT_DEFINED)

            def build(
                target: str = target, spec: Any = spec, implementation: Any = implementation
            ) -> None:
                worlds[target] = build_world(spec, implementation)

            answer = _answer(
                build, (lambda target=target: worlds[target].state()) if want_state else None
            )
        elif kind == "run":
            _, target, action, want_state = request
            world = worlds.get(target)
            answer = _answer(
                lambda: action(world), (lambda: world.state()) if want_state else None
            )
        elif kind == "enter":
            _, name, args = request
            stack = contexts.setdefault(name, ExitStack())
            answer = _answer(lambda: stack.enter_context(CONTEXTS[name](*args)) and None, None)
        elif kind == "exit":
            stack = contexts.pop(request[1], ExitStack())
            answer = _answer(stack.close, None)
        else:
            answer = {"raised": wire.encode(ValueError(f"unknown request {kind!r}"))}
        wire.send_answer(sock, answer)


class SandboxHole(Exception):
    """A file the sandbox should hide can be read: nothing is graded in this process."""


def prepare(payload: dict) -> None:
    """Everything that happens before the first student cell: the answer-free refimpl, limits,
    imports, sandbox."""
    from grader.exercises import answer_free
    from grader.sandbox.limits import (
        FileRules,
        Limits,
        deny_sockets,
        hidden_routes,
        readable_routes,
        restrict,
    )
    from grader.sandbox.processes import die_with_parent

    # first: nothing below may load an answer module from its file
    answer_free.install(payload.pop("sources"))
    die_with_parent()
    Limits(**payload["limits"]).apply(payload["processes_before"])
    # what the set-up cells and `serve` import, loaded while files can still be read
    import grader.exercises.paged_checks  # noqa: F401
    import grader.exercises.paged_worlds  # noqa: F401
    import refimpl.hybrid  # noqa: F401
    import refimpl.paged  # noqa: F401

    for check in payload["checks"]:
        getattr(grader, check)
    if payload["files"] is not None:
        rules = FileRules(**payload["files"])
        # the routes the grader found, and those this process finds from its own sys.path
        routes = sorted(hidden_routes(list(rules.hidden)))
        restrict(rules)
        readable = readable_routes(routes)
        if readable:
            raise SandboxHole(
                f"refused to grade: its code could read {len(readable)} of the reference's "
                f"hidden files despite the sandbox ({readable[0]}); grade in a container "
                "(see notebooks/exercises/README.md)"
            )
    if payload["deny_sockets"]:
        deny_sockets()


def main(argv: list[str]) -> int:
    sock = socket.socket(fileno=int(argv[1]))
    request = wire.read_request(sock)
    payload = request[1]
    try:
        prepare(payload)
    except SandboxHole as hole:
        wire.send_answer(sock, {"refused": str(hole)})
        return 2
    # no student code has run yet: this is the grader's own problem
    except Exception as exc:  # noqa: BLE001
        wire.send_answer(sock, {"setup_failed": f"{type(exc).__name__}: {exc}"})
        return 2
    # everything after this may come from the student's code
    wire.send_answer(sock, {"prepared": True})
    sys.stdout = sys.stderr = _Discard()
    namespace, problem = run_cells(payload["cells"])
    targets = payload["targets"]
    wire.send_answer(
        sock,
        {
            "ready": True,
            "problem": problem,
            "missing": [t for t in targets if t not in namespace],
        },
    )
    serve(sock, namespace, problem)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
