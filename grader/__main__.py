"""python -m grader NOTEBOOK|FOLDER...: grade exercise notebooks (see `grader.cli`)."""

from __future__ import annotations

import sys

from grader.cli import DESCRIPTION, add_arguments
from refimpl.cli import DefaultsHelpFormatter, OneLineErrorParser


def main(argv: list[str] | None = None) -> int:
    parser = OneLineErrorParser(
        prog="python -m grader", description=DESCRIPTION, formatter_class=DefaultsHelpFormatter
    )
    add_arguments(parser)
    try:
        args = parser.parse_args(argv)
        return int(args.func(args) or 0)
    # argparse's errors and --help: hand the status back to the caller
    except SystemExit as exc:
        return exc.code if isinstance(exc.code, int) else 1


if __name__ == "__main__":
    sys.exit(main())
