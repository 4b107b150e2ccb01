"""python -m refimpl: a small command line (plan a KV cache, simulate traffic on it, start
the lab, grade exercises).

Each sub-command lives next to the code it drives and registers itself here through
`add_parser(subparsers)`; the heavy imports happen only when that sub-command runs.
"""

from __future__ import annotations

import importlib
import sys

from refimpl.cli import OneLineErrorParser, run

# sub-command name -> module that defines `add_parser(subparsers)` and `main(args) -> int`.
# "grade" is the grader's command (`python -m grader`), loaded by name: the grader is a package
# above refimpl, which never imports it.
SUBCOMMANDS = {
    "plan": "refimpl.plan_cli",
    "lab": "refimpl.course.lab",
    "simulate": "refimpl.simulate_cli",
    "grade": "grader.cli",
}


def main(argv: list[str] | None = None) -> int:
    parser = OneLineErrorParser(prog="python -m refimpl", description=__doc__.splitlines()[0])
    subparsers = parser.add_subparsers(dest="command", required=True)
    argv = sys.argv[1:] if argv is None else list(argv)
    # a named sub-command loads only its own module (`plan` answers without the course layer)
    chosen = (
        {argv[0]: SUBCOMMANDS[argv[0]]} if argv and argv[0] in SUBCOMMANDS else SUBCOMMANDS
    )
    for _name, module_name in chosen.items():
        try:
            module = importlib.import_module(module_name)
        except ModuleNotFoundError as exc:
            # not installed (the module or its package): no such sub-command
            if not (exc.name and f"{module_name}.".startswith(f"{exc.name}.")):
                raise
            continue
        module.add_parser(subparsers)
    command = argv[0] if argv else None
    # a pasted serve command; vLLM's spellings (simulate takes plan's flags)
    if command in ("plan", "simulate") and command in chosen:
        try:
            argv = [command, *importlib.import_module(SUBCOMMANDS["plan"]).plan_argv(argv[1:])]
        except ValueError as exc:
            print(f"{parser.prog} {command}: error: {exc}", file=sys.stderr)
            return 2
    return run(parser, argv)


if __name__ == "__main__":
    sys.exit(main())
