"""python -m grader NOTEBOOK|FOLDER...: grade exercise notebooks (see `grader.cli`)."""

from __future__ import annotations

import sys

from grader.cli import DESCRIPTION, add_arguments
from refimpl.cli import DefaultsHelpFormatter, OneLineErrorParser, run


def main(argv: list[str] | None = None) -> int:
    parser = OneLineErrorParser(
        prog="python -m grader", description=DESCRIPTION, formatter_class=DefaultsHelpFormatter
    )
    add_arguments(parser)
    return run(parser, argv)


if __name__ == "__main__":
    sys.exit(main())
