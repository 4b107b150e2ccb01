"""Show the live source of the code a chapter teaches, so a notebook can never drift from the
package.

`show_source(BlockManager.allocate)` returns a `SourceView`: in JupyterLab (and on GitHub) it
renders as syntax-highlighted HTML with the file's own line numbers; its plain-text form, which
nbval compares, is the same lines with numbers. Lines to look at are picked by a piece of their
text, not by number, and a piece that no longer occurs raises, so an edit to the package that
moves the taught lines breaks the notebook's run instead of silently showing the wrong ones.
"""

from __future__ import annotations

import html
import inspect
import textwrap
from dataclasses import dataclass
from pathlib import Path

import refimpl

_PACKAGE_ROOT = Path(refimpl.__file__).resolve().parent.parent


@dataclass(frozen=True)
class SourceView:
    """Some lines of one source file, ready to display: `text` for nbval, HTML for
    JupyterLab."""

    path: str  # relative to the repository root, e.g. "refimpl/paged/block_manager.py"
    numbers: tuple[int, ...]  # the file's line number of each line
    lines: tuple[str, ...]  # dedented source lines, without newlines
    marked: frozenset[int]  # indices into `lines` of the lines to look at

    @property
    def title(self) -> str:
        return f"{self.path}, lines {self.numbers[0]}-{self.numbers[-1]}"

    def text(self) -> str:
        """The lines with the file's line numbers; a `>` marks each line to look at."""
        width = len(str(self.numbers[-1]))
        rows = [f"# {self.title}"]
        for index, line in enumerate(self.lines):
            marker = ">" if index in self.marked else " "
            # one space after the number: a 95-column line of code stays within 100 columns
            rows.append(f"{marker}{self.numbers[index]:>{width}} {line}".rstrip())
        return "\n".join(rows)

    def __repr__(self) -> str:
        return self.text()

    def _repr_html_(self) -> str:
        style = "font-family:monospace;font-size:90%;color:#555"
        caption = f'<div style="{style}">{html.escape(self.title)}</div>'
        try:
            from pygments import highlight
            from pygments.formatters import HtmlFormatter
            from pygments.lexers import PythonLexer
        except ImportError:  # without Pygments: the same lines, unhighlighted
            return caption + f"<pre>{html.escape(chr(10).join(self.lines))}</pre>"
        # One formatted line per source line (Pygments closes its spans at each newline), so
        # the file's own numbers can be put in front, gaps (a left-out docstring) included.
        body = highlight(
            "\n".join(self.lines), PythonLexer(), HtmlFormatter(noclasses=True, nowrap=True)
        )
        width = len(str(self.numbers[-1]))
        rows = []
        for index, line in enumerate(body.rstrip("\n").split("\n")):
            number = f'<span style="color:#999">{self.numbers[index]:>{width}} </span>'
            style = ' style="background:#fff3a8"' if index in self.marked else ""
            rows.append(f"<span{style}>{number}{line}</span>")
        return (
            caption
            + '<pre style="line-height:125%;background:#f8f8f8">'
            + "\n".join(rows)
            + "</pre>"
        )


def show_source(
    obj: object,
    *,
    start: str | None = None,
    stop: str | None = None,
    mark: tuple[str, ...] | list[str] = (),
    docstring: bool = True,
) -> SourceView:
    """The live source of a function, method or class, or an excerpt of it.

    `start` / `stop`: pieces of text; the excerpt runs from the first line containing `start`
    through the first later line containing `stop` (both included). `mark`: pieces of text
    whose lines are highlighted (each must occur in the excerpt). `docstring=False` leaves out
    the docstring of a function or method, to show only the lines that run. A piece that is not
    found raises ValueError naming it.
    """
    target = inspect.unwrap(obj.fget if isinstance(obj, property) else obj)
    try:
        source_lines, first_line = inspect.getsourcelines(target)
        filename = inspect.getsourcefile(target)
    except (TypeError, OSError) as error:
        raise ValueError(f"show_source: no Python source for {obj!r} ({error})") from None
    lines = textwrap.dedent("".join(source_lines)).rstrip("\n").split("\n")
    begin, end = 0, len(lines) - 1
    dropped = _docstring_lines(lines) if not docstring else range(0)
    if start is not None:
        begin = _find(lines, start, 0, obj)
    if stop is not None:
        end = _find(lines, stop, begin + (1 if start is not None else 0), obj)
    kept = [i for i in range(begin, end + 1) if i not in dropped]
    excerpt = [lines[i] for i in kept]
    marked = frozenset(_find(excerpt, piece, 0, obj) for piece in mark)
    path = Path(filename).resolve()
    try:
        shown_path = path.relative_to(_PACKAGE_ROOT).as_posix()
    except ValueError:
        shown_path = path.name
    return SourceView(shown_path, tuple(first_line + i for i in kept), tuple(excerpt), marked)


def _docstring_lines(lines: list[str]) -> range:
    """Indices of the docstring's lines in a function's source (empty range if it has none)."""
    import ast

    try:
        tree = ast.parse("\n".join(lines))
    except SyntaxError:
        return range(0)
    node = tree.body[0] if tree.body else None
    body = getattr(node, "body", None)
    if (
        body
        and isinstance(body[0], ast.Expr)
        and isinstance(body[0].value, ast.Constant)
        and isinstance(body[0].value.value, str)
    ):
        return range(body[0].lineno - 1, body[0].end_lineno)
    return range(0)


def _find(lines: list[str], piece: str, after: int, obj: object) -> int:
    for index in range(after, len(lines)):
        if piece in lines[index]:
            return index
    name = getattr(obj, "__qualname__", repr(obj))
    raise ValueError(f"show_source: {piece!r} does not occur in the source of {name}")
