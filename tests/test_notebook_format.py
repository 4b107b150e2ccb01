"""Notebooks are stored exactly as JupyterLab saves them: opening one and saving changes
nothing.

Three parts of that promise are checked separately: the metadata JupyterLab writes when the
kernel starts (compared with a real kernel's reply), the output area's joining of stream
outputs, and the Jupyter server's own open-and-save round trip of the file's bytes.
"""

from __future__ import annotations

import base64
import copy
import io
import json
import os
import re
import shutil
import sys
from pathlib import Path

import nbformat
import numpy as np
import pytest
from jupyter_client.kernelspec import KernelSpecManager
from jupyter_client.manager import start_new_kernel

from refimpl.course.notebook_format import (
    WIDGET_PLACEHOLDER,
    WIDGET_VIEW,
    ignores_output,
    kernel_metadata,
    lab_form,
    lab_text,
    main,
    merge_streams,
    pre_save_hook,
)

ROOT = Path(__file__).resolve().parents[1]
NOTEBOOKS = sorted((ROOT / "notebooks").glob("[0-9]*.ipynb")) + sorted(
    (ROOT / "notebooks" / "exercises").rglob("[0-9]*.ipynb")
)


def test_there_are_chapters_solutions_and_student_copies():
    assert len(NOTEBOOKS) >= 12 + 4 + 4


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: str(p.relative_to(ROOT)))
def test_notebook_is_stored_in_jupyterlab_form(path):
    assert path.read_text(encoding="utf-8") == lab_text(path), (
        f"run: python -m refimpl.course.notebook_format {path}"
    )


def test_all_notebooks_record_one_python_version():
    versions = {
        nbformat.read(p, as_version=4).metadata.language_info.version for p in NOTEBOOKS
    }
    assert len(versions) == 1, versions


@pytest.mark.slow
def test_kernel_metadata_is_what_the_kernel_itself_reports():
    """JupyterLab copies the kernel's kernel_info reply and kernelspec into the notebook on
    open."""
    kernelspec, language_info = kernel_metadata()
    manager, client = start_new_kernel(kernel_name="python3")
    try:
        reply = client.kernel_info(reply=True)["content"]
    finally:
        client.stop_channels()
        manager.shutdown_kernel(now=True)
    assert reply["language_info"] == language_info
    spec = KernelSpecManager().get_kernel_spec("python3")
    assert kernelspec == {
        "display_name": spec.display_name,
        "language": spec.language,
        "name": "python3",
    }
    stored = nbformat.read(NOTEBOOKS[0], as_version=4).metadata
    assert stored.kernelspec == kernelspec
    assert {k: v for k, v in stored.language_info.items() if k != "version"} == {
        k: v for k, v in language_info.items() if k != "version"
    }


def test_jupyter_server_open_and_save_leaves_the_bytes_alone(tmp_path, monkeypatch):
    from jupyter_server.services.contents.filemanager import FileContentsManager

    # the notary's signature database
    monkeypatch.setenv("JUPYTER_DATA_DIR", str(tmp_path / "data"))
    manager = FileContentsManager(root_dir=str(tmp_path))
    for path in NOTEBOOKS:
        shutil.copy(path, tmp_path / path.name)
        model = manager.get(path.name, content=True, type="notebook")
        manager.save(
            {"type": "notebook", "format": "json", "content": model["content"]}, path.name
        )
        assert (tmp_path / path.name).read_bytes() == path.read_bytes(), path.name


def test_split_stream_outputs_are_joined_and_timings_dropped():
    nb = nbformat.v4.new_notebook()
    cell = nbformat.v4.new_code_cell("print(1); print(2)")
    cell.outputs = [
        nbformat.v4.new_output("stream", name="stdout", text="1\n"),
        nbformat.v4.new_output("stream", name="stdout", text="2\n"),
        nbformat.v4.new_output("stream", name="stderr", text="warn\n"),
        nbformat.v4.new_output("stream", name="stdout", text="3\n"),
    ]
    cell.metadata["execution"] = {"iopub.execute_input": "2026-12-02T10:00:00Z"}
    nb.cells.append(cell)
    out = lab_form(nb)
    assert [(o.name, o.text) for o in out.cells[0].outputs] == [
        ("stdout", "1\n2\n"),
        ("stderr", "warn\n"),
        ("stdout", "3\n"),
    ]
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
    assert (
        nbformat.read(path, as_version=4).metadata.kernelspec.display_name
        == "Python 3 (ipykernel)"
    )


# --- saving from JupyterLab: `make lab` installs pre_save_hook
# ----------------------------------

HOOK = "refimpl.course.notebook_format.pre_save_hook"


def save_as_jupyterlab(
    folder: Path, name: str, content: dict, hook: str | None = HOOK
) -> bytes:
    """Save `content` through the Jupyter server's contents manager, as JupyterLab's (auto)save
    does."""
    from jupyter_server.services.contents.filemanager import FileContentsManager

    manager = FileContentsManager(
        root_dir=str(folder), **({"pre_save_hook": hook} if hook else {})
    )
    manager.save({"type": "notebook", "format": "json", "content": content}, name)
    return (folder / name).read_bytes()


def widget_run(nb) -> dict:
    """A notebook as the browser holds it after running a stepper cell: a widget view in the
    cell's output, the widget state in the metadata, split stdout and run timings."""
    content = copy.deepcopy(nbformat.from_dict(nb))
    cell = next(c for c in content.cells if c.cell_type == "code")
    cell.outputs = [
        nbformat.v4.new_output("stream", name="stdout", text="a\n"),
        nbformat.v4.new_output("stream", name="stdout", text="b\n"),
        nbformat.v4.new_output(
            "execute_result",
            execution_count=1,
            data={
                WIDGET_VIEW: {"model_id": "f00d", "version_major": 2, "version_minor": 0},
                "text/plain": "VBox(children=(...))",
            },
        ),
    ]
    cell.metadata["execution"] = {"iopub.execute_input": "2026-12-02T10:00:00Z"}
    content.metadata["widgets"] = {
        "application/vnd.jupyter.widget-state+json": {"state": {"f00d": {}}}
    }
    return content


def test_pre_save_hook_stores_the_placeholder_not_a_dead_widget(tmp_path, monkeypatch):
    monkeypatch.setenv("JUPYTER_DATA_DIR", str(tmp_path / "data"))
    content = widget_run(
        nbformat.v4.new_notebook(cells=[nbformat.v4.new_code_cell("stepper.widget()")])
    )
    saved = json.loads(save_as_jupyterlab(tmp_path, "hooked.ipynb", content))
    outputs = saved["cells"][0]["outputs"]
    assert outputs == [
        {"name": "stdout", "output_type": "stream", "text": ["a\n", "b\n"]},
        {
            "data": {"text/plain": [WIDGET_PLACEHOLDER]},
            "metadata": {},
            "output_type": "display_data",
        },
    ]
    assert (
        "widgets" not in saved["metadata"] and "execution" not in saved["cells"][0]["metadata"]
    )
    assert saved["metadata"]["kernelspec"] == kernel_metadata()[0]
    # what it would store
    plain = json.loads(save_as_jupyterlab(tmp_path, "plain.ipynb", content, hook=None))
    assert (
        WIDGET_VIEW in plain["cells"][0]["outputs"][2]["data"]
        and "widgets" in plain["metadata"]
    )


def test_pre_save_hook_leaves_other_files_alone():
    model = {"type": "file", "format": "text", "content": "x"}
    pre_save_hook(model=model, path="notes.txt")
    assert model == {"type": "file", "format": "text", "content": "x"}


def _lab_config() -> tuple[dict, dict]:
    """(the server options, the settings defaults) of the course's Jupyter configuration."""
    from refimpl.course.lab import CONFIG_DIR

    server = json.loads((CONFIG_DIR / "jupyter_server_config.json").read_text("utf-8"))
    settings = json.loads(
        (CONFIG_DIR / "labconfig" / "default_setting_overrides.json").read_text("utf-8")
    )
    return server, settings


def test_the_lab_config_installs_the_hook_and_silences_the_news():
    server, overrides = _lab_config()
    assert server["ContentsManager"] == {"pre_save_hook": HOOK}
    assert server["LabApp"] == {
        "news_url": None,
        "check_for_updates_class": "jupyterlab.NeverCheckForUpdate",
    }
    import jupyterlab

    schema_path = (
        Path(sys.prefix)
        / "share"
        / "jupyter"
        / "lab"
        / "schemas"
        / "@jupyterlab"
        / "apputils-extension"
        / "notification.json"
    )
    schema = json.loads(schema_path.read_text(encoding="utf-8"))["properties"]
    settings = overrides["@jupyterlab/apputils-extension:notification"]
    assert settings == {"fetchNews": "false", "checkForUpdates": False}
    # "Never": no pop-up asking
    assert {"const": "false", "title": "Never"} in schema["fetchNews"]["oneOf"]
    assert schema["checkForUpdates"]["type"] == "boolean" and jupyterlab.NeverCheckForUpdate
    # closing a notebook's tab shuts its kernel down (JupyterLab 4's default leaves it running:
    # a reader who went through five chapters had seven kernels holding memory)
    tracker = json.loads(
        (schema_path.parents[1] / "notebook-extension" / "tracker.json").read_text(
            encoding="utf-8"
        )
    )["properties"]
    assert overrides["@jupyterlab/notebook-extension:tracker"] == {"kernelShutdown": True}
    assert tracker["kernelShutdown"]["type"] == "boolean"
    assert tracker["kernelShutdown"]["default"] is False
    assert set(overrides) == {
        "@jupyterlab/apputils-extension:notification",
        "@jupyterlab/notebook-extension:tracker",
    }


def test_every_route_to_the_lab_is_python_m_refimpl_lab(monkeypatch):
    """`make lab` runs `python -m refimpl lab`, which starts this Python's JupyterLab on the
    notebooks with the course's configuration folder first on JUPYTER_CONFIG_PATH (and copies
    nothing into the environment); the README gives conda users the same command."""
    import refimpl.course.lab as lab
    from refimpl.__main__ import main as refimpl_main

    makefile = (ROOT / "Makefile").read_text(encoding="utf-8")
    assert re.search(r"^lab: \$\(STAMP\)\n\t\$\(BIN\)/python -m refimpl lab ", makefile, re.M)
    assert "share/jupyter" not in makefile
    readme = (ROOT / "README.md").read_text(encoding="utf-8")
    assert "python -m refimpl lab" in readme.split("Conda users")[1].split("\n\n")[0]
    started = []
    monkeypatch.setattr(lab.subprocess, "call", lambda cmd, env: started.append((cmd, env)))
    monkeypatch.setenv("JUPYTER_CONFIG_PATH", "/elsewhere")
    monkeypatch.chdir(ROOT)
    assert refimpl_main(["lab", "--no-browser", "--port=8890"]) == 0
    [(command, env)] = started
    assert command[:3] == [sys.executable, "-m", "jupyterlab"]
    assert f"--notebook-dir={ROOT / 'notebooks'}" in command
    assert command[-2:] == ["--no-browser", "--port=8890"]
    assert env["JUPYTER_CONFIG_PATH"].split(os.pathsep) == [str(lab.CONFIG_DIR), "/elsewhere"]


@pytest.mark.slow
@pytest.mark.parametrize("name", ["00_start_here", "07_kernels"])
def test_run_all_then_save_from_jupyterlab_leaves_the_chapter_unchanged(
    name, tmp_path, monkeypatch
):
    """Run All of a chapter with a stepper (and, in 07, a timing), then JupyterLab's save: the
    file is byte for byte the committed one (outputs, execution counts, metadata), so
    `git status` stays clean. The simulated run below covers every chapter; this one runs."""
    import subprocess
    import sys

    monkeypatch.setenv("JUPYTER_DATA_DIR", str(tmp_path / "data"))
    monkeypatch.delenv("REFIMPL_WRITE_FIGURES", raising=False)
    chapter = ROOT / "notebooks" / f"{name}.ipynb"
    nb = nbformat.read(chapter, as_version=4)
    assert any("stepper.widget()" in c.source for c in nb.cells), (
        "pick a chapter with a stepper"
    )
    for cell in nb.cells:
        if cell.cell_type == "code":
            cell.outputs, cell.execution_count = [], None
    cleared, executed = tmp_path / "cleared.ipynb", tmp_path / "executed.ipynb"
    nbformat.write(nb, cleared)
    # Run All in a fresh interpreter, as JupyterLab's kernel runs apart from the server: the
    # test worker's own state (event loops, signal handlers of earlier tests) cannot reach it,
    # and a stuck kernel fails the test within the limit instead of holding the whole run.
    script = (
        "import sys, nbformat\n"
        "from nbclient import NotebookClient\n"
        "nb = nbformat.read(sys.argv[1], as_version=4)\n"
        "NotebookClient(nb, timeout=120, startup_timeout=60, kernel_name='python3', "
        "record_timing=True,\n"
        "               store_widget_state=True, resources={'metadata': {'path': "
        "sys.argv[3]}}).execute()\n"
        "nbformat.write(nb, sys.argv[2])\n"
    )
    subprocess.run(
        [sys.executable, "-c", script, str(cleared), str(executed), str(tmp_path)],
        check=True,
        timeout=300,
    )
    run = json.loads(executed.read_text(encoding="utf-8"))
    assert any(
        WIDGET_VIEW in o.get("data", {}) for c in run["cells"] for o in c.get("outputs", [])
    )
    shutil.copy(chapter, tmp_path / chapter.name)  # the reader's checkout, saved over
    saved = save_as_jupyterlab(tmp_path, chapter.name, run)
    assert (
        json.loads(saved)["metadata"]
        == json.loads(chapter.read_text(encoding="utf-8"))["metadata"]
    )
    counts = [
        c.get("execution_count")
        for c in json.loads(saved)["cells"]
        if c["cell_type"] == "code"
    ]
    assert counts == list(range(1, len(counts) + 1))
    assert saved == chapter.read_bytes(), (
        f"re-execute the chapter: make notebooks NB=notebooks/{chapter.name}"
    )


@pytest.mark.slow
def test_jupyter_lab_started_as_make_lab_starts_it(tmp_path):
    """A real JupyterLab started by `python -m refimpl lab` (what `make lab` runs): the news
    question is answered "never", no update check runs, closing a tab shuts its kernel down, a
    notebook saved through its REST API (as the browser saves) is stored with the stepper's
    placeholder, and no file of the environment was written or changed."""
    import os
    import socket
    import subprocess
    import time
    import urllib.request

    root = tmp_path / "notebooks"
    root.mkdir()
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    env = {
        **os.environ,
        **{
            f"JUPYTER_{k}_DIR": str(tmp_path / k.lower())
            for k in ("CONFIG", "DATA", "RUNTIME")
        },
    }
    command = [
        sys.executable,
        "-m",
        "refimpl",
        "lab",
        "--no-browser",
        f"--port={port}",
        "--ip=127.0.0.1",
        "--IdentityProvider.token=",
        "--ServerApp.disable_check_xsrf=True",
        f"--notebook-dir={root}",
    ]
    environment = Path(sys.prefix)
    before = _tree(environment / "share" / "jupyter") | _tree(environment / "etc" / "jupyter")
    server = subprocess.Popen(
        command, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE
    )
    base = f"http://127.0.0.1:{port}"

    def call(path, data=None, method="GET"):
        request = urllib.request.Request(
            base + path, data=data, method=method, headers={"Content-Type": "application/json"}
        )
        with urllib.request.urlopen(request, timeout=10) as response:
            return response.read().decode()

    try:
        for _ in range(120):
            try:
                call("/api/status")
                break
            except OSError:
                assert server.poll() is None, server.stderr.read().decode()[-2000:]
                time.sleep(0.5)
        notification = json.loads(
            call("/lab/api/settings/@jupyterlab/apputils-extension:notification")
        )
        assert notification["schema"]["properties"]["fetchNews"]["default"] == "false"
        assert notification["schema"]["properties"]["checkForUpdates"]["default"] is False
        assert json.loads(call("/lab/api/update")) == {"notification": None}
        tracker = json.loads(call("/lab/api/settings/@jupyterlab/notebook-extension:tracker"))
        assert tracker["schema"]["properties"]["kernelShutdown"]["default"] is True
        assert '"news": {"disabled": true}' in call("/lab").replace("&#34;", '"')
        content = widget_run(
            nbformat.v4.new_notebook(cells=[nbformat.v4.new_code_cell("stepper.widget()")])
        )
        call(
            "/api/contents/run.ipynb",
            json.dumps({"type": "notebook", "format": "json", "content": content}).encode(),
            method="PUT",
        )
        saved = json.loads((root / "run.ipynb").read_text(encoding="utf-8"))
        assert saved["cells"][0]["outputs"][-1]["data"] == {"text/plain": [WIDGET_PLACEHOLDER]}
        assert "widgets" not in saved["metadata"]
    finally:
        server.terminate()
        server.wait(timeout=30)
    after = _tree(environment / "share" / "jupyter") | _tree(environment / "etc" / "jupyter")
    assert after == before, f"written into the environment: {sorted(after - before)[:5]}"


def _tree(folder: Path) -> set[tuple[str, int]]:
    """(path, modification time in ns) of every file under `folder`."""
    return {(str(p), p.stat().st_mtime_ns) for p in folder.rglob("*") if p.is_file()}


def as_run_all_leaves_it(nb: dict) -> dict:
    """The committed notebook as the browser holds it after Run All, before saving: every
    difference a real run makes, and only those (strict nbval checks that the other outputs
    come back the same). Steppers are live widgets again, with their state in the metadata;
    stdout arrives in pieces; cells carry run timings; the output of a cell that tells the
    test runner to ignore it (a timing) has other numbers."""
    content = copy.deepcopy(nb)
    state = {}
    for index, cell in enumerate(content["cells"]):
        if cell["cell_type"] != "code":
            continue
        cell["metadata"]["execution"] = {"iopub.execute_input": "2026-12-04T10:00:00Z"}
        outputs = []
        for output in cell["outputs"]:
            data = output.get("data", {})
            if "".join(data.get("text/plain", [])) == WIDGET_PLACEHOLDER:
                model_id = f"{index:032x}"
                state[model_id] = {"model_name": "VBoxModel", "state": {}}
                output = {
                    **output,
                    "data": {
                        WIDGET_VIEW: {"model_id": model_id, "version_major": 2},
                        "text/plain": "VBox(children=(Play(value=0), IntSlider(value=0)))",
                    },
                }
            if output["output_type"] == "stream":
                lines = "".join(output["text"]).splitlines(keepends=True)
                outputs += [{**output, "text": line} for line in lines]
            else:
                outputs.append(output)
        if IGNORED in "".join(cell["source"]):
            outputs = json.loads(re.sub(r"\d", "7", json.dumps(outputs)))
        cell["outputs"] = outputs
    content["metadata"]["widgets"] = {
        "application/vnd.jupyter.widget-state+json": {"state": state, "version_major": 2}
    }
    return content


IGNORED = "# NBVAL_IGNORE_OUTPUT"


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: str(p.relative_to(ROOT)))
def test_run_all_then_save_leaves_every_notebook_unchanged(path, tmp_path, monkeypatch):
    """Every chapter and exercise: what a Run All changes, saved by JupyterLab through `make
    lab`'s pre-save hook over the reader's checkout, gives back the committed bytes."""
    monkeypatch.setenv("JUPYTER_DATA_DIR", str(tmp_path / "data"))
    committed = json.loads(path.read_text(encoding="utf-8"))
    run = as_run_all_leaves_it(committed)
    shutil.copy(path, tmp_path / path.name)
    assert save_as_jupyterlab(tmp_path, path.name, run) == path.read_bytes()
    if run != committed:  # the check can fail: without the hook the run shows as a change
        assert save_as_jupyterlab(tmp_path, "plain.ipynb", run, hook=None) != path.read_bytes()


def test_the_hook_keeps_a_timing_only_while_its_cell_is_unchanged(tmp_path, monkeypatch):
    monkeypatch.setenv("JUPYTER_DATA_DIR", str(tmp_path / "data"))
    nb = nbformat.v4.new_notebook(
        cells=[nbformat.v4.new_code_cell(f"{IGNORED}\nprint(time())", id="t")]
    )
    nb.cells[0].outputs = [nbformat.v4.new_output("stream", name="stdout", text="1.0 ms\n")]
    first = save_as_jupyterlab(tmp_path, "t.ipynb", nb)
    nb.cells[0].outputs[0].text = "2.0 ms\n"
    assert save_as_jupyterlab(tmp_path, "t.ipynb", nb) == first  # a rerun: kept
    nb.cells[0].source += "  # edited"
    edited = json.loads(save_as_jupyterlab(tmp_path, "t.ipynb", nb))
    assert edited["cells"][0]["outputs"][0]["text"] == ["2.0 ms\n"]  # an edit: the new one
    assert not ignores_output("print(1)  # NBVAL_IGNORE_OUTPUT is explained below")


# --- figures drawn on another machine: same picture, other bytes
# --------------------------------


def _png_of(draw) -> bytes:
    """A PNG of a small figure drawn by `draw(ax)`, at twice the dpi as the chapters store."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    fig = Figure(figsize=(4, 2.5))
    draw(fig.add_subplot())
    FigureCanvasAgg(fig)
    buffer = io.BytesIO()
    fig.savefig(buffer, format="png", dpi=200)
    return buffer.getvalue()


def _bars(ax, height=3, label="3 blocks"):
    ax.bar([0, 1], [2, height], color=["#4c72b0", "#dd8452"])
    ax.axvline(0.5, color="black", lw=1)
    ax.set_title(label)


def _nudged(png: bytes) -> bytes:
    """The same picture as another machine draws it: anti-aliasing shades off by up to 17/255
    and one edge moved over by one pixel (as the 05, 05b and 10 figures were)."""
    from PIL import Image

    from refimpl.course.same_picture import decode

    pixels = decode(png)
    rng = np.random.default_rng(0)
    shade = rng.integers(-17, 18, size=pixels.shape[:2])
    edges = (pixels[..., :3].min(axis=2) > 20) & (pixels[..., :3].max(axis=2) < 235)
    pixels[..., :3] += np.where(edges, shade, 0)[..., None]
    column = int(np.argmin(pixels[:, :, :3].sum(axis=2).sum(axis=0)))  # the black line
    pixels[:, column + 1] = pixels[:, column]
    buffer = io.BytesIO()
    Image.fromarray(np.clip(pixels, 0, 255).astype(np.uint8), "RGBA").save(buffer, "png")
    return buffer.getvalue()


def _b64(png: bytes) -> str:
    return base64.b64encode(png).decode("ascii")


def test_same_picture_tolerates_another_machine_but_not_a_change():
    from refimpl.course.same_picture import decode, same_picture

    png = _png_of(_bars)
    nudged = _nudged(png)
    assert nudged != png
    difference = np.abs(decode(nudged) - decode(png)).max(axis=2)
    assert difference.max() > 200 and 0 < (difference > 32).mean() < 0.01
    assert same_picture(_b64(png), _b64(nudged)) and same_picture(nudged, png)
    # real changes: a number in a label, a bar one unit taller, a colour
    assert not same_picture(png, _png_of(lambda ax: _bars(ax, label="4 blocks")))
    assert not same_picture(png, _png_of(lambda ax: _bars(ax, height=4)))
    assert not same_picture(
        png, _png_of(lambda ax: ax.bar([0, 1], [2, 3], color=["#4c72b0", "#c44e52"]))
    )
    assert not same_picture(png, b"not a png")


def _figure_notebook(png: bytes, source: str = "draw()"):
    nb = nbformat.v4.new_notebook(cells=[nbformat.v4.new_code_cell(source, id="fig")])
    nb.cells[0].outputs = [
        nbformat.v4.new_output(
            "display_data", data={"image/png": _b64(png), "text/plain": "<Figure>"}
        )
    ]
    return nb


def _stored_png(data: bytes) -> str:
    return "".join(json.loads(data)["cells"][0]["outputs"][0]["data"]["image/png"]).strip()


def test_the_hook_keeps_a_figure_drawn_the_same_elsewhere(tmp_path, monkeypatch):
    """Run All + save on another machine: the figure's new bytes show the same picture, so the
    committed bytes stay; a figure that changed, or a cell that was edited, saves the new one."""
    monkeypatch.setenv("JUPYTER_DATA_DIR", str(tmp_path / "data"))
    png = _png_of(_bars)
    committed = save_as_jupyterlab(tmp_path, "f.ipynb", _figure_notebook(png))
    assert save_as_jupyterlab(tmp_path, "f.ipynb", _figure_notebook(_nudged(png))) == committed
    changed = _png_of(lambda ax: _bars(ax, label="4 blocks"))
    saved = save_as_jupyterlab(tmp_path, "f.ipynb", _figure_notebook(changed))
    assert _stored_png(saved) == _b64(changed)
    edited = save_as_jupyterlab(
        tmp_path, "f.ipynb", _figure_notebook(_nudged(changed), "draw()  # edited")
    )
    assert _stored_png(edited) == _b64(_nudged(changed))


def test_make_notebooks_keeps_the_committed_figure_bytes(tmp_path):
    """`python -m refimpl.course.notebook_format` after a re-execution compares with the
    committed version: the same picture keeps the committed bytes, a changed one is written."""
    import subprocess

    def git(*args):
        subprocess.run(["git", "-C", str(tmp_path), *args], check=True, capture_output=True)

    git("init", "-q")
    path = tmp_path / "f.ipynb"
    png = _png_of(_bars)
    nbformat.write(_figure_notebook(png), path)
    assert main([str(path)]) == 0
    git("add", "f.ipynb")
    git("-c", "user.name=t", "-c", "user.email=t@t", "commit", "-q", "-m", "figure")
    committed = path.read_bytes()
    nbformat.write(_figure_notebook(_nudged(png)), path)  # what nbconvert --inplace wrote
    assert main([str(path)]) == 0
    assert path.read_bytes() == committed
    changed = _png_of(lambda ax: _bars(ax, height=4))
    nbformat.write(_figure_notebook(changed), path)
    assert main([str(path)]) == 0
    assert _stored_png(path.read_bytes()) == _b64(changed)
