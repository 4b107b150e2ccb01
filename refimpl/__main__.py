"""python -m refimpl: a small command line for scripts (plan a KV cache, grade exercises).

`plan` is the core's own command. Any other sub-command is a plugin: a distribution registers
it under the `refimpl.commands` entry-point group (the grader registers `grade` in
pyproject.toml), as `name = "package.module:add_parser"`, and `add_parser(subparsers)` adds it.
The core never names a package above it; it only reads the installed metadata.
"""

from __future__ import annotations

import sys
from importlib.metadata import EntryPoint, entry_points

from refimpl.cli import OneLineErrorParser, run

COMMAND_GROUP = "refimpl.commands"


def registered_commands() -> dict[str, EntryPoint]:
    """The plugin sub-commands installed in this environment, by name (first one wins)."""
    commands: dict[str, EntryPoint] = {}
    for entry_point in entry_points(group=COMMAND_GROUP):
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
    everything = command != "plan" and command not in plugins
    if everything or command == "plan":
        from refimpl import plan_cli

        plan_cli.add_parser(subparsers)
    for name, entry_point in plugins.items():
        if everything or command == name:
            entry_point.load()(subparsers)
    if command == "plan":  # a pasted serve command; vLLM's spellings
        from refimpl import plan_cli

        try:
            argv = ["plan", *plan_cli.plan_argv(argv[1:])]
        except ValueError as exc:
            print(f"{parser.prog} plan: error: {exc}", file=sys.stderr)
            return 2
    return run(parser, argv)


if __name__ == "__main__":
    sys.exit(main())
