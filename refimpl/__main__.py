"""python -m refimpl: a small command line for scripts (plan a KV cache, grade exercises).

Each sub-command lives next to the code it drives and registers itself here through
`add_parser(subparsers)`; the heavy imports happen only when that sub-command runs.
"""

from __future__ import annotations

import importlib
import sys

from refimpl.cli import OneLineErrorParser

# sub-command name -> module that defines `add_parser(subparsers)` and `main(args) -> int`
SUBCOMMANDS = {
    "plan": "refimpl.plan_cli",
    "grade": "refimpl.course.cli",
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
            if exc.name != module_name:
                raise
            continue
        module.add_parser(subparsers)
    try:
        args = parser.parse_args(argv)
        return int(args.func(args) or 0)
    # argparse's errors and --help: hand the status back to the caller
    except SystemExit as exc:
        return exc.code if isinstance(exc.code, int) else 1


if __name__ == "__main__":
    sys.exit(main())
