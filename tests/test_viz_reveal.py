"""`reveal()` hides a self-check's answer in a closed box, while its plain text stays
checkable."""

from __future__ import annotations

import nbformat
import pytest
from nbclient import NotebookClient

from refimpl.viz.reveal import Answer, reveal


def test_answer_plain_text_is_the_printed_text_and_html_is_a_closed_box():
    answer = Answer("x = 3\n<y>\n")
    assert repr(answer) == "x = 3\n<y>"
    html = answer._repr_html_()
    assert html.startswith("<details><summary>Reveal the answer</summary>")
    assert "open" not in html.split(">", 1)[0]  # closed until the reader clicks
    assert "&lt;y&gt;" in html and "<y>" not in html


def test_outside_a_notebook_the_answer_is_printed(capsys):
    with reveal():
        print("blocks:", [1, 2])
    assert capsys.readouterr().out == "blocks: [1, 2]\n"


@pytest.mark.slow  # starts a kernel
def test_in_a_kernel_only_one_collapsed_display_comes_out():
    nb = nbformat.v4.new_notebook(
        cells=[
            nbformat.v4.new_code_cell(
                "from refimpl.viz import reveal\nwith reveal():\n    print('answer', 6 * 7)"
            )
        ]
    )
    NotebookClient(nb, timeout=60, kernel_name="python3").execute()
    (output,) = nb.cells[0].outputs
    assert output.output_type == "display_data"
    assert output.data["text/plain"] == "answer 42"
    assert output.data["text/html"].startswith("<details><summary>")
