"""Intake: which files a class run grades, and a one-line reason for each one it does not.

A folder stands for every entry directly inside it whose name ends in `.ipynb` (hidden names
aside), whatever the entry is: a notebook, a folder, a FIFO, a link. Each one gets a row, so
nothing handed in disappears without a word. Every file is read before any student code runs
(`grader.grading.open_submission`: no link followed anywhere on the path).

Two names of one file (a hard link) are told apart by time. A new name updates two clocks at
once: the file's change time (`st_ctime`: its link count changed) and the modification time of
the folder the name was made in. So a name whose folder last changed before the file did
existed before the file's last change, and a name whose folder changed at (or after) it may be
the one that made it. When every name of the file is among the notebooks graded and exactly one
of them is older than the file's last change, that one is graded and the others are refused as
names made later. In every other case (names in one folder, a name outside the graded
notebooks, the file changed again after the link) the times cannot say, and every name is
refused with a reason that says so, blaming none. The guide's advice removes the question:
collect submissions into a folder only the instructor can write.
"""

from __future__ import annotations

import os
from collections import defaultdict
from collections.abc import Callable
from pathlib import Path

from grader.grading import Submission, open_submission

# a folder changed this close before the file counts as changed with it (clocks are coarse);
# the margin only ever makes two names harder to tell apart, never blames the wrong one
SAME_TIME_NS = 10_000_000


def notebooks_in(folder: Path) -> list[Path]:
    """Every entry of `folder` named like a notebook (`*.ipynb`, not hidden), sorted, whatever
    kind of file it is."""
    with os.scandir(folder) as entries:
        names = [e.name for e in entries if e.name.endswith(".ipynb")]
    return sorted(folder / name for name in names if not name.startswith("."))


def expand_folders(paths: list[Path], error: Callable[[str], object]) -> list[Path]:
    """Folders stand for the entries named like notebooks directly inside them (sorted); other
    paths are kept as given. `error(message)` reports a folder with no such entry (the
    parser's one-line error)."""
    expanded: list[Path] = []
    for path in paths:
        if not path.is_dir() or path.suffix == ".ipynb":
            expanded.append(path)  # a folder named like a notebook is refused by what it is
            continue
        notebooks = notebooks_in(path)
        if not notebooks:
            error(f"folder {path} holds no .ipynb notebooks")
        expanded.extend(notebooks)
    return expanded


def read_all(paths: list[Path]) -> list[bytes | str]:
    """Every notebook's bytes, read before any student code runs (so none can change
    another's), or why it is not graded: what is in the way, the same name given twice, or
    the later name of a hard link (see the module's docstring)."""
    read: list[Submission | str] = []
    for path in paths:
        try:
            read.append(open_submission(path))
        except ValueError as exc:
            read.append(str(exc))
    first_of: dict[tuple[int, int, str], Path] = {}
    names: dict[tuple[int, int], list[int]] = defaultdict(list)
    for index, item in enumerate(read):
        if isinstance(item, str):
            continue
        if item.entry in first_of:
            read[index] = f"it is the same file as {first_of[item.entry]}"
            continue
        first_of[item.entry] = item.path
        names[item.inode].append(index)
    for indices in names.values():
        group = [read[i] for i in indices]
        if group[0].file.st_nlink > 1:
            for index, why in zip(indices, link_verdicts(group)):
                if why is not None:
                    read[index] = why
    return [item if isinstance(item, str) else item.content for item in read]


def link_verdicts(names: list[Submission]) -> list[str | None]:
    """For the graded names of one file with several names: None for the name that is graded,
    else why that name is not."""
    links = max(n.file.st_nlink for n in names)
    changed = max(n.file.st_ctime_ns for n in names)
    if len(names) < links:
        why = (
            f"it has {links} names (hard links), not all among the notebooks graded, so "
            "whose it is cannot be told; hand in a file of its own"
        )
        return [why] * len(names)
    older = [n for n in names if n.folder.st_mtime_ns < changed - SAME_TIME_NS]
    if len(older) == 1 and len(names) > 1:
        first = older[0]
        return [
            None
            if n is first
            else f"it is a second name (hard link) of {first.path}, made later; hand in a "
            "file of its own"
            for n in names
        ]
    return [
        f"its file is also named {', '.join(str(o.path) for o in names if o is not n)} "
        "(hard links), and the folders' times cannot tell which name came first; not graded: "
        "ask who handed in which"
        for n in names
    ]
