"""How long each chapter's Run All takes, as a reader runs it: a fresh kernel, every cell in
order, the notebook's folder as working directory, no GPU.

    python benchmarks/run_all_chapters.py                          # every chapter
    python benchmarks/run_all_chapters.py notebooks/12_*.ipynb     # some

Nothing is written back: the notebook is executed in memory (nbclient, as `make notebooks`
does through nbconvert). Reported per chapter: seconds from the kernel's start to the last
cell's end, and the slowest cell. The goal is at most 60 s per chapter on 2 cores; the script
exits with 1 when a chapter takes longer. Times depend on what else the machine runs.
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from pathlib import Path

import nbformat
from nbclient import NotebookClient

ROOT = Path(__file__).resolve().parent.parent
GOAL_S = 60.0


def run_all(path: Path) -> tuple[float, float, int]:
    """(seconds for the whole notebook, seconds of its slowest cell, that cell's index)."""
    notebook = nbformat.read(path, as_version=4)
    client = NotebookClient(
        notebook,
        timeout=600,
        kernel_name="python3",
        resources={"metadata": {"path": str(path.parent)}},
    )
    cell_times: list[tuple[float, int]] = []
    start = time.perf_counter()
    with client.setup_kernel():
        for index, cell in enumerate(notebook.cells):
            began = time.perf_counter()
            client.execute_cell(cell, index)
            cell_times.append((time.perf_counter() - began, index))
    total = time.perf_counter() - start
    slowest, where = max(cell_times, default=(0.0, -1))
    return total, slowest, where


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("notebooks", nargs="*", type=Path)
    args = parser.parse_args(argv)
    paths = args.notebooks or sorted((ROOT / "notebooks").glob("[0-9]*.ipynb"))
    os.environ["CUDA_VISIBLE_DEVICES"] = ""  # the kernel inherits it: the laptop course
    over = []
    for path in paths:
        total, slowest, where = run_all(path.resolve())
        mark = "" if total <= GOAL_S else f"  OVER {GOAL_S:.0f} s"
        print(f"{path.name:40s} {total:6.1f} s  (slowest cell {where}: {slowest:.1f} s){mark}")
        if total > GOAL_S:
            over.append(path.name)
    print(f"{len(paths) - len(over)} of {len(paths)} chapters within {GOAL_S:.0f} s")
    return 1 if over else 0


if __name__ == "__main__":
    sys.exit(main())
