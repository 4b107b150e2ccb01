"""argparse pieces shared by the `python -m refimpl` sub-commands."""

from __future__ import annotations

import argparse
import difflib
import sys


class OneLineErrorParser(argparse.ArgumentParser):
    """argparse, with a bad argument reported in one line and negative values reaching their
    check.

    A parser with `refuse_unknown_options = True` names the nearest known flag for an unknown
    one (difflib). Plain argparse prints the whole usage before the error, and reads
    `--memory -5GiB` as a missing value followed by an unknown option `-5GiB`; here that value
    goes to `--memory`'s own check, which can then say what is wrong with it.
    """

    def error(self, message: str):
        self.exit(2, f"{self.prog}: error: {message} (see {self.prog} --help)\n")

    def parse_known_args(self, args=None, namespace=None):
        args = list(sys.argv[1:] if args is None else args)
        takes_one_value = {
            option
            for action in self._actions
            if action.nargs is None and action.option_strings
            for option in action.option_strings
        }
        glued: list[str] = []
        for arg in args:
            if (
                glued
                and glued[-1] in takes_one_value
                and arg[:1] == "-"
                and arg[1:2].isdigit()
            ):
                glued[-1] = f"{glued[-1]}={arg}"
            else:
                glued.append(arg)
        namespace, extras = super().parse_known_args(glued, namespace)
        unknown = [a for a in extras if a.startswith("-")]
        if unknown and getattr(self, "refuse_unknown_options", False):
            flag = unknown[0].split("=", 1)[0]
            near = difflib.get_close_matches(flag, list(self._option_string_actions), n=1)
            hint = f"; did you mean {near[0]}?" if near else ""
            self.error(f"unknown flag {flag}{hint}")
        return namespace, extras


class DefaultsHelpFormatter(argparse.HelpFormatter):
    """Shows "(default: X)" after an option's help, except for flags and options without a
    default."""

    def _get_help_string(self, action: argparse.Action) -> str:
        help_text = action.help or ""
        # a flag (store_true, store_false: it takes no value) has no default worth showing
        if (
            action.default in (None, False, argparse.SUPPRESS)
            or not action.option_strings
            or action.nargs == 0
        ):
            return help_text
        return f"{help_text} (default: %(default)s)"


def run(parser: argparse.ArgumentParser, argv: list[str] | None) -> int:
    """Parse `argv` and run the chosen command's `func(args)`; the exit status, also for
    argparse's errors and --help (handed back to the caller instead of exiting)."""
    try:
        args = parser.parse_args(argv)
        return int(args.func(args) or 0)
    except SystemExit as exc:
        return exc.code if isinstance(exc.code, int) else 1
