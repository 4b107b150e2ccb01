"""`python -m refimpl` finds its plugin sub-commands (the grader's `grade`) through installed
entry points, never by a module name written in the core."""

from __future__ import annotations

import sys

from refimpl import __main__ as refimpl_main


def _fake_distribution(root, name: str, commands: dict[str, str]) -> None:
    """A minimal installed distribution under `root`: metadata plus its entry points."""
    info = root / f"{name}-1.0.dist-info"
    info.mkdir()
    (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {name}\nVersion: 1.0\n")
    lines = [f"{key} = {value}" for key, value in commands.items()]
    (info / "entry_points.txt").write_text("[refimpl.commands]\n" + "\n".join(lines) + "\n")


def test_a_registered_command_is_found_and_runs(tmp_path, monkeypatch, capsys):
    _fake_distribution(tmp_path, "fakecourse", {"hello": "fakecourse_cmd:add_parser"})
    (tmp_path / "fakecourse_cmd.py").write_text(
        "def add_parser(subparsers):\n"
        "    parser = subparsers.add_parser('hello')\n"
        "    parser.set_defaults(func=lambda args: print('hello from a plugin') or 0)\n"
    )
    monkeypatch.syspath_prepend(str(tmp_path))
    assert "hello" in refimpl_main.registered_commands()
    assert refimpl_main.main(["hello"]) == 0
    assert capsys.readouterr().out == "hello from a plugin\n"
    monkeypatch.delitem(sys.modules, "fakecourse_cmd")


def test_grade_without_the_grader_installed_is_one_clear_line(monkeypatch, capsys):
    monkeypatch.setattr(refimpl_main, "registered_commands", dict)
    assert refimpl_main.main(["grade", "x.ipynb"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1
    assert "the grader is not installed" in err
    assert "refimpl.commands" in err


def test_plan_answers_without_loading_any_plugin(tmp_path, monkeypatch, capsys):
    _fake_distribution(tmp_path, "brokencourse", {"boom": "no_such_module_here:add_parser"})
    monkeypatch.syspath_prepend(str(tmp_path))
    assert refimpl_main.main(["plan", "--help"]) == 0
    assert "plan" in capsys.readouterr().out


def test_the_project_registers_grade():
    """pyproject.toml declares the grader's entry point (what `pip install` turns into
    metadata)."""
    import tomllib
    from pathlib import Path

    pyproject = tomllib.loads(Path(__file__).parents[1].joinpath("pyproject.toml").read_text())
    commands = pyproject["project"]["entry-points"]["refimpl.commands"]
    assert commands == {"grade": "grader.cli:add_parser"}
