"""`python -m refimpl lab`: JupyterLab on the course's notebooks, with the course's settings.

The settings live in `lab_config/`, a Jupyter configuration folder this command puts first on
JupyterLab's search path (`JUPYTER_CONFIG_PATH`) for the server it starts; nothing is written
into the Python environment, so it works the same in `.venv`, in a conda environment and in a
read-only or shared one. `make lab` runs this command.

- `jupyter_server_config.json`: notebooks are saved in the form `make notebooks` commits
  (`refimpl.course.notebook_format.pre_save_hook`: a Run All leaves the checkout clean), and
  JupyterLab neither fetches news nor checks for updates;
- `labconfig/default_setting_overrides.json`: new defaults for JupyterLab's settings: closing a
  notebook's tab shuts its kernel down (JupyterLab's own default leaves every kernel running),
  and the news and update questions are answered "never".

A plain `jupyter lab` finds the same settings when started as
`JUPYTER_CONFIG_PATH=<this folder> jupyter lab` (Jupyter does not read configuration from the
directory it is started in).
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
from pathlib import Path

#: The Jupyter configuration folder with the course's server options and settings defaults.
CONFIG_DIR = Path(__file__).resolve().parent / "lab_config"
#: The checkout's notebooks folder (refimpl is installed editable, so the package sits in it).
CHECKOUT_NOTEBOOKS = Path(__file__).resolve().parents[2] / "notebooks"


def lab_environment(environ: dict[str, str] | None = None) -> dict[str, str]:
    """A copy of `environ` (default: this process's) with `CONFIG_DIR` first on
    JUPYTER_CONFIG_PATH, ahead of any folders already listed there."""
    env = dict(os.environ if environ is None else environ)
    listed = [p for p in env.get("JUPYTER_CONFIG_PATH", "").split(os.pathsep) if p]
    env["JUPYTER_CONFIG_PATH"] = os.pathsep.join(
        [str(CONFIG_DIR)] + [p for p in listed if Path(p) != CONFIG_DIR]
    )
    return env


def notebook_dir() -> Path:
    """Where the lab opens: ./notebooks when started in a checkout, else the checkout's own
    notebooks, else the current folder."""
    here = Path.cwd() / "notebooks"
    if here.is_dir():
        return here
    return CHECKOUT_NOTEBOOKS if CHECKOUT_NOTEBOOKS.is_dir() else Path.cwd()


def lab_command(jupyter_args: list[str]) -> list[str]:
    """The command line that starts JupyterLab: this Python's jupyterlab, the notebooks folder
    (unless the arguments name one), --allow-root when run as root (JupyterLab refuses root
    otherwise), then `jupyter_args` as given."""
    command = [sys.executable, "-m", "jupyterlab"]
    if not any(a.startswith(("--notebook-dir", "--ServerApp.root_dir")) for a in jupyter_args):
        command.append(f"--notebook-dir={notebook_dir()}")
    if hasattr(os, "getuid") and os.getuid() == 0 and "--allow-root" not in jupyter_args:
        command.append("--allow-root")
    return command + list(jupyter_args)


def add_parser(subparsers: argparse._SubParsersAction) -> argparse.ArgumentParser:
    parser = subparsers.add_parser(
        "lab",
        help="start JupyterLab on the course's notebooks with the course's settings",
        description=__doc__.splitlines()[0],
    )
    parser.epilog = (
        "Any other argument is passed on to `jupyter lab` (for example --no-browser "
        "--port=8890)."
    )
    parser.set_defaults(func=main, passed_on=[])
    return parser


def main(args: argparse.Namespace) -> int:
    try:
        return subprocess.call(lab_command(args.passed_on), env=lab_environment())
    except KeyboardInterrupt:  # Ctrl-C stops the lab: no traceback
        return 0
