"""Self-check answers that stay hidden until the reader asks for them.

A chapter's Self-check asks a question; the next code cell computes the answer inside
`with reveal():`. Whatever the block prints is not shown as plain output but as one collapsed
`<details>` box, whose summary reads "Reveal the answer". JupyterLab, GitHub's notebook view
and a static HTML export all render that box closed, so the answer is one click away and never
on screen before the reader has predicted. The plain-text form of the same output is the
printed text itself, so strict nbval still compares every number.
"""

from __future__ import annotations

import contextlib
import html
import io
import sys
from collections.abc import Iterator

SUMMARY = "Reveal the answer"


class Answer:
    """What a reveal cell displays: `text/plain` is the answer, `text/html` a closed box.

    Any long text that should stay folded until asked for (a stepper's text strip) uses it too.
    """

    def __init__(self, text: str, summary: str = SUMMARY) -> None:
        self.text = text.rstrip("\n")
        self.summary = summary

    def __repr__(self) -> str:
        return self.text

    def _repr_html_(self) -> str:
        return (
            f"<details><summary>{html.escape(self.summary)}</summary>"
            f"<pre>{html.escape(self.text)}</pre></details>"
        )


def _in_notebook() -> bool:
    """True inside a Jupyter kernel (where `display` renders rich output)."""
    shell = sys.modules.get("IPython")
    if shell is None:
        return False
    from IPython import get_ipython

    ip = get_ipython()
    return ip is not None and getattr(ip, "kernel", None) is not None


@contextlib.contextmanager
def reveal(summary: str = SUMMARY) -> Iterator[None]:
    """Collect what the block prints and show it as one collapsed answer box.

    Outside a notebook (a script, a test) the text is printed as usual.
    """
    buffer = io.StringIO()
    with contextlib.redirect_stdout(buffer):
        yield
    answer = Answer(buffer.getvalue(), summary)
    if _in_notebook():
        from IPython.display import display

        display(answer)
    else:
        print(answer.text)
