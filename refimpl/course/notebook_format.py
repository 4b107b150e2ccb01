"""Store notebooks exactly as JupyterLab would save them, so opening one changes nothing.

When JupyterLab opens a notebook and its kernel starts, it writes the kernel's own `kernelspec`
and `language_info` into the notebook's metadata, and its output area joins consecutive stream
outputs of the same name. Any difference marks the notebook modified, autosave rewrites it, and
a student finds local changes they never made. nbconvert, which `make notebooks` runs, writes
neither form exactly: older metadata stays, and stdout may be split into several stream outputs
depending on when the kernel flushed. `lab_form` applies JupyterLab's changes; the file is then
written by nbformat, as the Jupyter server writes it on save.

    python -m refimpl.course.notebook_format NOTEBOOK...          # rewrite in place
    python -m refimpl.course.notebook_format --check NOTEBOOK...  # exit 1 if any would change

The same form is applied when JupyterLab saves: `make lab` installs `pre_save_hook` as the
Jupyter server's pre-save hook, so a Run All (whose autosave would otherwise store widget views
naming models that no longer exist when the notebook is reopened) leaves the committed file
unchanged. Cells whose output differs at every run (a timing, marked `# NBVAL_IGNORE_OUTPUT`
for the test runner) keep the output already in the file, as long as their source is unchanged.

Figures: the same code draws PNG bytes that differ a little from machine to machine. A cell
whose source is unchanged keeps the stored PNG when the new one shows the same picture within
`refimpl.course.same_picture`'s tolerance (a channel off by at most 32/255, an edge moved by at
most one pixel); a figure that really changed is saved. The hook compares with the file being
saved over; the command line compares with the version committed in git (`git show HEAD:`), so
`make notebooks` on another machine leaves the committed figures' bytes alone.
"""

from __future__ import annotations

import argparse
import copy
import subprocess
import sys
from pathlib import Path

from refimpl.course.same_picture import same_picture


def kernel_metadata() -> tuple[dict, dict]:
    """(kernelspec, language_info) as JupyterLab records them for this environment's Python 3
    kernel."""
    import ipykernel.kernelspec
    from ipykernel.ipkernel import IPythonKernel

    spec = ipykernel.kernelspec.get_kernel_dict()
    kernelspec = {
        "display_name": spec["display_name"],
        "language": spec["language"],
        "name": ipykernel.kernelspec.KERNEL_NAME,
    }
    return kernelspec, copy.deepcopy(IPythonKernel.language_info)


def merge_streams(outputs: list) -> list:
    """Consecutive stream outputs to the same stream joined into one, as JupyterLab's output
    area does."""
    merged: list = []
    for output in outputs:
        previous = merged[-1] if merged else None
        if (
            output.get("output_type") == "stream"
            and previous is not None
            and previous.get("output_type") == "stream"
            and previous.get("name") == output.get("name")
        ):
            previous["text"] = _text(previous["text"]) + _text(output["text"])
        else:
            merged.append(copy.deepcopy(output))
    return merged


def _text(text: str | list[str]) -> str:
    return text if isinstance(text, str) else "".join(text)


def lab_form(notebook):
    """A copy of `notebook` (an nbformat NotebookNode) with JupyterLab's changes already
    applied."""
    import nbformat

    result = copy.deepcopy(notebook)
    kernelspec, language_info = kernel_metadata()
    result.metadata["kernelspec"] = kernelspec
    result.metadata["language_info"] = language_info
    for cell in result.cells:
        cell.metadata.pop("execution", None)  # run timestamps: they change at every execution
        if cell.cell_type == "code":
            cell.outputs = [
                nbformat.from_dict(o) for o in merge_streams(static_widgets(cell.outputs))
            ]
    result.metadata.pop("widgets", None)  # live widget state: new model ids at every execution
    return result


WIDGET_VIEW = "application/vnd.jupyter.widget-view+json"
WIDGET_PLACEHOLDER = (
    "[interactive stepper: run this cell in JupyterLab; "
    "the static strip shows the same frames]"
)


def static_widgets(outputs: list) -> list:
    """Widget views replaced by one fixed line: a saved view names a model id that changes at
    every run and that no static viewer (GitHub, nbval) can show; running the cell brings the
    widget back."""
    result = []
    for output in outputs:
        if WIDGET_VIEW in output.get("data", {}):
            output = {
                "output_type": "display_data",
                "metadata": {},
                "data": {"text/plain": WIDGET_PLACEHOLDER},
            }
        result.append(output)
    return result


def pre_save_hook(model: dict, path: str = "", contents_manager=None, **kwargs) -> None:
    """A Jupyter server pre-save hook: a notebook is saved in `lab_form`, as `make notebooks`
    stores it.

    `make lab` passes it as
    `--ContentsManager.pre_save_hook=refimpl.course.notebook_format.pre_save_hook`. The server
    calls it with the model it is about to write; other files pass through untouched.
    """
    if model.get("type") != "notebook" or not isinstance(model.get("content"), dict):
        return
    import nbformat

    content = lab_form(nbformat.from_dict(model["content"]))
    root = getattr(contents_manager, "root_dir", None)
    stored = Path(root, path) if root is not None and path else None
    if stored is not None and stored.is_file():
        try:
            before = nbformat.read(stored, as_version=4)
        except (OSError, ValueError, KeyError):  # not a notebook we can read: save as is
            before = None
        if before is not None:
            keep_stored_outputs(content, before)
            keep_same_pictures(content, before)
    model["content"] = content


IGNORED_OUTPUT = "NBVAL_IGNORE_OUTPUT"


def ignores_output(source: str) -> bool:
    """Whether a cell tells the test runner (nbval) not to compare its output: a timing, which
    differs at every run."""
    return any(
        line.strip().lstrip("#").strip() == IGNORED_OUTPUT for line in source.splitlines()
    )


def keep_stored_outputs(notebook, stored) -> None:
    """In place: every cell of `notebook` whose output varies from run to run (it carries
    `# NBVAL_IGNORE_OUTPUT`) gets back the outputs of the stored cell with the same id and
    source, so Run All then save leaves the file as it was; an edited cell keeps its new
    output."""
    for cell, old in _same_cells(notebook, stored):
        # a model may hold the source as a list of lines
        if ignores_output(_text(cell.get("source", ""))):
            cell.outputs = copy.deepcopy(old.outputs)


def _same_cells(notebook, stored):
    """(cell, stored cell) for each code cell of `notebook` whose stored cell (same id) has the
    same source."""
    before = {cell.get("id"): cell for cell in stored.cells if cell.cell_type == "code"}
    for cell in notebook.cells:
        old = before.get(cell.get("id"))
        if (
            cell.cell_type == "code"
            and old is not None
            and _text(old.get("source", "")) == _text(cell.get("source", ""))
        ):
            yield cell, old


PNG = "image/png"


def keep_same_pictures(notebook, stored) -> int:
    """In place: in every cell of `notebook` whose source equals its stored cell's, a PNG that
    `same_picture` finds equal to the stored PNG at the same place is replaced by the stored
    bytes. Returns how many were kept."""
    kept = 0
    for cell, old in _same_cells(notebook, stored):
        if len(cell.get("outputs", [])) != len(old.get("outputs", [])):
            continue
        for output, old_output in zip(cell.outputs, old.outputs):
            new_png = output.get("data", {}).get(PNG)
            old_png = old_output.get("data", {}).get(PNG)
            if (
                new_png is not None
                and old_png is not None
                and new_png != old_png
                and output.get("output_type") == old_output.get("output_type")
                and same_picture(_text(new_png), _text(old_png))
            ):
                output["data"][PNG] = copy.deepcopy(old_png)
                kept += 1
    return kept


def committed_notebook(path: Path):
    """The version of `path` committed in git (HEAD), or None when there is none (no git, not a
    repository, a new file, or not a notebook)."""
    import nbformat

    path = Path(path).resolve()
    try:
        shown = subprocess.run(
            ["git", "-C", str(path.parent), "show", f"HEAD:./{path.name}"],
            capture_output=True,
            check=True,
            timeout=60,
        )
        return nbformat.reads(shown.stdout.decode("utf-8"), as_version=4)
    except (OSError, subprocess.SubprocessError, UnicodeDecodeError, ValueError, KeyError):
        return None


def lab_text(path: Path, committed=None) -> str:
    """What the Jupyter server would write for `path` after JupyterLab opened it; with
    `committed` (a stored version of it), figures that show the same picture keep its bytes."""
    import nbformat

    notebook = nbformat.read(path, as_version=nbformat.NO_CONVERT)
    result = lab_form(notebook)
    if committed is not None:
        keep_same_pictures(result, committed)
    return nbformat.writes(result, version=nbformat.NO_CONVERT) + "\n"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("notebooks", nargs="+", type=Path, metavar="NOTEBOOK")
    parser.add_argument(
        "--check",
        action="store_true",
        help="change nothing; exit 1 if a notebook is not in this form",
    )
    args = parser.parse_args(argv)
    changed = []
    for path in args.notebooks:
        # rewriting after a re-execution: a figure drawn the same (within the tolerance) keeps
        # the committed bytes, so another machine's `make notebooks` changes no figure
        text = lab_text(path, committed=None if args.check else committed_notebook(path))
        if path.read_text(encoding="utf-8") != text:
            changed.append(path)
            if not args.check:
                path.write_text(text, encoding="utf-8")
    for path in changed:
        print(f"{'not in JupyterLab form' if args.check else 'rewrote'}: {path}")
    return 1 if args.check and changed else 0


if __name__ == "__main__":
    sys.exit(main())
