"""python -m refimpl: a small command line for scripts (plan a KV cache, grade exercises).

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
    "grade": "grader.cli",
}


def main(argv: list[str] | None = None) -> int:
    parser = OneLineErrorParser(prog="python -m refimpl", description=__doc__.splitlines()[0])
    subparsers = parser.add_subparsers(dest="command", required=True)
    for _name, module_name in SUBCOMMANDS.items():
        try:
            module = importlib.import_module(module_name)
        except ModuleNotFoundError as exc:
            # not installed (the module or its package): no such sub-command
            if not (exc.name and f"{module_name}.".startswith(f"{exc.name}.")):
                raise
            continue
        module.add_parser(subparsers)
    return run(parser, argv)


if __name__ == "__main__":
    sys.exit(main())
