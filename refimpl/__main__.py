"""python -m refimpl: plan a KV cache, simulate traffic on it, start the lab, grade exercises.

The package's own sub-commands are listed in `BUILTIN`, each imported by name only when it
runs. Any other sub-command is a plugin: a distribution registers it under the
`refimpl.commands` entry-point group (the grader registers `grade` in pyproject.toml) as
`name = "package.module:add_parser"`, and `add_parser(subparsers)` adds it. The core never
names a package above it; it only reads the installed metadata.
"""

from __future__ import annotations

import sys
from collections.abc import Callable
from importlib.metadata import EntryPoint, entry_points
from types import ModuleType

from refimpl.cli import OneLineErrorParser, run

COMMAND_GROUP = "refimpl.commands"


def _plan() -> ModuleType:
    from refimpl import plan_cli

    return plan_cli


def _lab() -> ModuleType:
    from refimpl.course import lab

    return lab


def _simulate() -> ModuleType:
    from refimpl import simulate_cli

    return simulate_cli


# sub-command -> loader of the module that defines `add_parser(subparsers)` (and `plan_argv`
# when it takes plan's vLLM flags)
BUILTIN: dict[str, Callable[[], ModuleType]] = {
    "plan": _plan,
    "lab": _lab,
    "simulate": _simulate,
}
#: the sub-commands that take `vllm serve`'s flags (simulate plans before it replays)
TAKES_PLAN_FLAGS = ("plan", "simulate")


def registered_commands() -> dict[str, EntryPoint]:
    """The plugin sub-commands installed in this environment, by name (first one wins)."""
    commands: dict[str, EntryPoint] = {}
    for entry_point in entry_points(group=COMMAND_GROUP):
        if entry_point.name not in BUILTIN:
            commands.setdefault(entry_point.name, entry_point)
    return commands


def main(argv: list[str] | None = None) -> int:
    parser = OneLineErrorParser(prog="python -m refimpl", description=__doc__.splitlines()[0])
    subparsers = parser.add_subparsers(dest="command", required=True)
    argv = sys.argv[1:] if argv is None else list(argv)
    command = argv[0] if argv and not argv[0].startswith("-") else None
    plugins = registered_commands()
    if command == "grade" and command not in plugins:
        print(
            f"{parser.prog} grade: error: the grader is not installed (no 'grade' in the "
            f"{COMMAND_GROUP} entry points); install the course with `pip install -e .`",
            file=sys.stderr,
        )
        return 2
    # a named sub-command loads only its own module (`plan` answers without the course layer);
    # none, or an unknown one, loads them all so that --help and the error list every choice
    everything = command not in BUILTIN and command not in plugins
    for name, load in BUILTIN.items():
        if everything or command == name:
            load().add_parser(subparsers)
    for name, entry_point in plugins.items():
        if everything or command == name:
            entry_point.load()(subparsers)
    if command in TAKES_PLAN_FLAGS:  # a pasted serve command; vLLM's spellings
        try:
            argv = [command, *_plan().plan_argv(argv[1:])]
        except ValueError as exc:
            print(f"{parser.prog} {command}: error: {exc}", file=sys.stderr)
            return 2
    return run(parser, argv)


if __name__ == "__main__":
    sys.exit(main())
