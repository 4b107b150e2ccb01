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
unchanged.
"""

from __future__ import annotations

import argparse
import copy
import sys
from pathlib import Path


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

    model["content"] = lab_form(nbformat.from_dict(model["content"]))


def lab_text(path: Path) -> str:
    """What the Jupyter server would write for `path` after JupyterLab opened it."""
    import nbformat

    notebook = nbformat.read(path, as_version=nbformat.NO_CONVERT)
    return nbformat.writes(lab_form(notebook), version=nbformat.NO_CONVERT) + "\n"


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
        text = lab_text(path)
        if path.read_text(encoding="utf-8") != text:
            changed.append(path)
            if not args.check:
                path.write_text(text, encoding="utf-8")
    for path in changed:
        print(f"{'not in JupyterLab form' if args.check else 'rewrote'}: {path}")
    return 1 if args.check and changed else 0


if __name__ == "__main__":
    sys.exit(main())
