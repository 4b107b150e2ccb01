"""Notebooks are stored exactly as JupyterLab saves them: opening one and saving changes nothing.

Three parts of that promise are checked separately: the metadata JupyterLab writes when the kernel
starts (compared with a real kernel's reply), the output area's joining of stream outputs, and the
Jupyter server's own open-and-save round trip of the file's bytes.
"""

from __future__ import annotations

import shutil
from pathlib import Path

import nbformat
import pytest
from jupyter_client.kernelspec import KernelSpecManager
from jupyter_client.manager import start_new_kernel

from refimpl.course.notebook_format import kernel_metadata, lab_form, lab_text, main, merge_streams

ROOT = Path(__file__).resolve().parents[1]
NOTEBOOKS = sorted((ROOT / "notebooks").glob("[0-9]*.ipynb")) + sorted((ROOT / "notebooks" / "exercises").rglob("[0-9]*.ipynb"))


def test_there_are_chapters_solutions_and_student_copies():
    assert len(NOTEBOOKS) >= 12 + 4 + 4


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: str(p.relative_to(ROOT)))
def test_notebook_is_stored_in_jupyterlab_form(path):
    assert path.read_text(encoding="utf-8") == lab_text(path), f"run: python -m refimpl.course.notebook_format {path}"


def test_all_notebooks_record_one_python_version():
    versions = {nbformat.read(p, as_version=4).metadata.language_info.version for p in NOTEBOOKS}
    assert len(versions) == 1, versions


@pytest.mark.slow
def test_kernel_metadata_is_what_the_kernel_itself_reports():
    """JupyterLab copies the kernel's kernel_info reply and kernelspec into the notebook on open."""
    kernelspec, language_info = kernel_metadata()
    manager, client = start_new_kernel(kernel_name="python3")
    try:
        reply = client.kernel_info(reply=True)["content"]
    finally:
        client.stop_channels()
        manager.shutdown_kernel(now=True)
    assert reply["language_info"] == language_info
    spec = KernelSpecManager().get_kernel_spec("python3")
    assert kernelspec == {"display_name": spec.display_name, "language": spec.language, "name": "python3"}
    stored = nbformat.read(NOTEBOOKS[0], as_version=4).metadata
    assert stored.kernelspec == kernelspec
    assert {k: v for k, v in stored.language_info.items() if k != "version"} == \
        {k: v for k, v in language_info.items() if k != "version"}


def test_jupyter_server_open_and_save_leaves_the_bytes_alone(tmp_path, monkeypatch):
    from jupyter_server.services.contents.filemanager import FileContentsManager

    monkeypatch.setenv("JUPYTER_DATA_DIR", str(tmp_path / "data"))  # the notary's signature database
    manager = FileContentsManager(root_dir=str(tmp_path))
    for path in NOTEBOOKS:
        shutil.copy(path, tmp_path / path.name)
        model = manager.get(path.name, content=True, type="notebook")
        manager.save({"type": "notebook", "format": "json", "content": model["content"]}, path.name)
        assert (tmp_path / path.name).read_bytes() == path.read_bytes(), path.name


def test_split_stream_outputs_are_joined_and_timings_dropped():
    nb = nbformat.v4.new_notebook()
    cell = nbformat.v4.new_code_cell("print(1); print(2)")
    cell.outputs = [nbformat.v4.new_output("stream", name="stdout", text="1\n"),
                    nbformat.v4.new_output("stream", name="stdout", text="2\n"),
                    nbformat.v4.new_output("stream", name="stderr", text="warn\n"),
                    nbformat.v4.new_output("stream", name="stdout", text="3\n")]
    cell.metadata["execution"] = {"iopub.execute_input": "2026-12-02T10:00:00Z"}
    nb.cells.append(cell)
    out = lab_form(nb)
    assert [(o.name, o.text) for o in out.cells[0].outputs] == [("stdout", "1\n2\n"), ("stderr", "warn\n"), ("stdout", "3\n")]
    assert "execution" not in out.cells[0].metadata
    assert out.metadata.kernelspec.display_name == "Python 3 (ipykernel)"
    assert len(nb.cells[0].outputs) == 4  # the input is untouched
    assert merge_streams([]) == []


def test_check_mode_reports_and_rewrite_mode_fixes(tmp_path, capsys):
    path = tmp_path / "nb.ipynb"
    nb = nbformat.read(NOTEBOOKS[0], as_version=4)
    nb.metadata.kernelspec.display_name = "Python 3"  # what an older tool wrote
    nbformat.write(nb, path)
    assert main(["--check", str(path)]) == 1
    assert "not in JupyterLab form" in capsys.readouterr().out
    assert main([str(path)]) == 0 and main(["--check", str(path)]) == 0
    assert nbformat.read(path, as_version=4).metadata.kernelspec.display_name == "Python 3 (ipykernel)"
