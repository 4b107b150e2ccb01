"""`make student-bundle`: the course as students get it, without the exercise solutions.

A checkout of this repository holds the solution notebooks (`notebooks/exercises/solutions/`),
and its git history holds them too. Students get a bundle instead: every tracked file of the
checkout except the solutions, the instructor guide (replaced by a short student guide) and the
tests that read the solutions, as a folder and a zip, with no git history. The builder refuses
to write a bundle when a bundled file has local changes (unless `--allow-dirty`), when a
student copy is stale (`make exercises` first) or when any bundled code cell still holds a
solution region.

    # writes dist/student-bundle/ and dist/student-bundle.zip
    python -m grader.bundle dist/student-bundle [--allow-dirty]
"""

from __future__ import annotations

import argparse
import json
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

from grader.exercises.catalogue import BEGIN, SOLUTIONS_DIR, STUDENT_DIR, stale_copies

EXCLUDED = (
    f"{SOLUTIONS_DIR.as_posix()}/",
    f"{STUDENT_DIR.as_posix()}/README.md",  # the instructor guide
    "tests/test_course_notebooks.py",  # grades the solutions
    "tests/test_grading_attacks.py",  # grades the solutions
    ".ci/",
)

STUDENT_GUIDE = """# Exercises

Each notebook here is one exercise. Open it in Jupyter (`make lab`), read it top to bottom and
write your code in the cells marked `# YOUR CODE HERE`, in place of the `raise
NotImplementedError(...)` lines. Helper functions you add must live in those cells too.

The last cell of each notebook runs its grader and prints a PASS/FAIL table; a failing row
names the first step where your code's state differs from the reference's, and what was
expected and found. From a terminal you can grade a saved notebook exactly as your
instructor will:

    python -m grader notebooks/exercises/01_block_manager.ipynb

Using refimpl's own version of what an exercise asks you to write (subclassing it, calling it,
or loading it some other way) scores 0.
"""


def bundled_files(root: Path) -> list[str]:
    """The checkout's tracked files that go into the bundle (paths relative to `root`)."""
    try:
        listed = subprocess.run(
            ["git", "-C", str(root), "ls-files", "-z"], capture_output=True, check=True
        ).stdout
    except (OSError, subprocess.CalledProcessError) as exc:
        raise ValueError(
            f"build the bundle from a git checkout of the course ({exc})"
        ) from None
    files = [name for name in listed.decode().split("\0") if name]
    return sorted(
        name for name in files if not name.startswith(EXCLUDED) and (root / name).is_file()
    )


def changed_files(root: Path, files: list[str]) -> list[str]:
    """The bundled files whose working copy differs from the last commit (staged or not): a
    chapter an instructor ran, an edit not yet committed."""
    try:
        listed = subprocess.run(
            ["git", "-C", str(root), "diff", "--name-only", "-z", "HEAD", "--"],
            capture_output=True,
            check=True,
        ).stdout
    except (OSError, subprocess.CalledProcessError) as exc:
        raise ValueError(f"cannot compare the checkout with its last commit ({exc})") from None
    changed = {name for name in listed.decode().split("\0") if name}
    return [name for name in files if name in changed]


def solution_leaks(root: Path, files: list[str]) -> list[str]:
    """Bundled notebooks with a code cell that still holds a solution region."""
    leaks = []
    for name in files:
        if not name.endswith(".ipynb"):
            continue
        cells = json.loads((root / name).read_text(encoding="utf-8")).get("cells", [])
        if any(
            cell.get("cell_type") == "code" and BEGIN in "".join(cell.get("source", ""))
            for cell in cells
        ):
            leaks.append(name)
    return leaks


def build(root: Path, out: Path, *, allow_dirty: bool = False) -> Path:
    """Write the bundle folder `out` and `out`.zip (stable file order and times); return the
    zip's path.

    A tracked file with local changes is refused (a bundle is the committed course), naming
    each one, unless `allow_dirty`: then the working copies go in and a note names them.
    """
    root = root.resolve()
    files = bundled_files(root)
    changed = changed_files(root, files)
    if changed and not allow_dirty:
        raise ValueError(
            f"{len(changed)} tracked file{'s' if len(changed) > 1 else ''} with local changes "
            f"would be bundled as they are now: {', '.join(changed)}; commit or restore them "
            "(git restore FILE), or pass --allow-dirty (make student-bundle "
            "BUNDLE_ARGS=--allow-dirty) to bundle the working copies"
        )
    if changed:
        print(f"note: bundling local changes to {', '.join(changed)}", file=sys.stderr)
    stale = stale_copies(root)
    if stale:
        raise ValueError(
            f"stale student copies (run `make exercises` first): {', '.join(stale)}"
        )
    leaks = solution_leaks(root, files)
    if leaks:
        raise ValueError(f"these notebooks still hold solution code: {', '.join(leaks)}")
    if out.exists():
        shutil.rmtree(out)
    out.mkdir(parents=True)
    contents = {name: (root / name).read_bytes() for name in files}
    contents[f"{STUDENT_DIR.as_posix()}/README.md"] = STUDENT_GUIDE.encode()
    archive = out.with_name(out.name + ".zip")
    with zipfile.ZipFile(archive, "w", zipfile.ZIP_DEFLATED) as zipped:
        for name in sorted(contents):
            target = out / name
            target.parent.mkdir(parents=True, exist_ok=True)
            target.write_bytes(contents[name])
            mode = (root / name).stat().st_mode & 0o777 if name in files else 0o644
            target.chmod(mode)
            info = zipfile.ZipInfo(f"{out.name}/{name}", date_time=(1980, 1, 1, 0, 0, 0))
            info.external_attr = mode << 16
            zipped.writestr(info, contents[name], zipfile.ZIP_DEFLATED)
    return archive


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m grader.bundle",
        description="Write the student bundle (no solutions).",
    )
    parser.add_argument(
        "out", type=Path, help="bundle folder to write (its .zip is written next to it)"
    )
    parser.add_argument(
        "--root",
        type=Path,
        default=Path("."),
        help="repository root (default: current directory)",
    )
    parser.add_argument(
        "--allow-dirty",
        action="store_true",
        help="bundle tracked files with local changes as they are (refused otherwise)",
    )
    args = parser.parse_args(argv)
    try:
        archive = build(args.root, args.out, allow_dirty=args.allow_dirty)
    except ValueError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    print(f"wrote {args.out}/ and {archive}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
