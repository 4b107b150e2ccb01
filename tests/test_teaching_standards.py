"""Every chapter keeps the course's teaching standards (CONTRIBUTING.md, "Teaching standards").

Learning goals up front; the code being taught shown from the live package; self-checks that
ask first and reveal after; a Summary and a Next link; no private shorthand ("seed") in
anything a reader sees. Each rule is checked per chapter, so a failure names the notebook and
the rule.
"""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

NOTEBOOKS = Path(__file__).resolve().parent.parent / "notebooks"
CHAPTERS = sorted(NOTEBOOKS.glob("[0-9]*.ipynb"))
TEACHING_CHAPTERS = [path for path in CHAPTERS if not path.name.startswith("00_")]

# "seed" is allowed only as a random seed: "seed=0", "seed 3", "random seed(s)", "seeded".
ALLOWED_SEED = re.compile(
    r"(?i)random seeds?|\bseeds?\s*=|\bseeds?\s+\d|manual_seed|_seed\b|\bseed_"
)
ANY_SEED = re.compile(r"(?i)\bseeds?\b|seed's")


def cells(path: Path) -> list[dict]:
    return json.loads(path.read_text(encoding="utf-8"))["cells"]


def text(cell: dict) -> str:
    return "".join(cell["source"])


def output_text(cell: dict) -> str:
    parts = []
    for output in cell.get("outputs", []):
        if "text" in output:
            parts.append("".join(output["text"]))
        for mime, value in output.get("data", {}).items():
            if mime.startswith("text/"):
                parts.append("".join(value))
    return "\n".join(parts)


def sections(path: Path) -> dict[str, list[dict]]:
    """Cells grouped under their `## ` heading (the heading's own cell included)."""
    grouped: dict[str, list[dict]] = {"": []}
    current = ""
    for cell in cells(path):
        if cell["cell_type"] == "markdown":
            for line in text(cell).splitlines():
                if line.startswith("## "):
                    current = line[3:].strip()
                    grouped.setdefault(current, [])
        grouped[current].append(cell)
    return grouped


def ids(paths: list[Path]) -> list[str]:
    return [path.stem for path in paths]


@pytest.mark.parametrize("path", CHAPTERS, ids=ids(CHAPTERS))
def test_opens_with_title_and_learning_goals(path):
    first = cells(path)[0]
    assert first["cell_type"] == "markdown", "cell 0 must be markdown"
    lines = text(first).splitlines()
    number = path.name.split("_")[0]
    assert lines[0].startswith(f"# {number} · "), f"title line must start with '# {number} · '"
    assert "You will learn:" in lines, "cell 0 needs a 'You will learn:' line"
    goals = lines[lines.index("You will learn:") + 1 :]
    bullets = [line for line in goals if line.startswith(("- ", "* "))]
    assert 2 <= len(bullets) <= 6, f"2-6 learning goals expected, found {len(bullets)}"


@pytest.mark.parametrize("path", TEACHING_CHAPTERS, ids=ids(TEACHING_CHAPTERS))
def test_shows_the_code_it_teaches(path):
    shown = [
        cell
        for cell in cells(path)
        if cell["cell_type"] == "code" and "show_source(" in text(cell)
    ]
    assert shown, "a chapter shows the package code it teaches with show_source(...)"


@pytest.mark.parametrize("path", TEACHING_CHAPTERS, ids=ids(TEACHING_CHAPTERS))
def test_self_check_asks_first_and_reveals_after(path):
    grouped = sections(path)
    assert "Self-check" in grouped, "no '## Self-check' section"
    questions = 0
    waiting = False  # a question was asked and its reveal cell has not come yet
    for cell in grouped["Self-check"]:
        source = text(cell)
        if cell["cell_type"] == "markdown":
            # **Q1.** or, with its kind, **Q1 (apply).** / **Q1 (why).** / **Q1 (recall).**
            asked = len(
                re.findall(
                    r"^\*\*Q\d+(?: \((?:apply|why|recall)\))?\.\*\*", source, flags=re.M
                )
            )
            questions += asked
            waiting = waiting or asked > 0
        else:
            assert source.startswith("# Reveal"), (
                "a self-check code cell must start with '# Reveal' (the answer runs after "
                "the reader "
                f"predicts); found: {source.splitlines()[0] if source else '(empty)'!r}"
            )
            assert waiting, "a '# Reveal' cell must follow the question it answers"
            waiting = False
    assert questions >= 2, f"at least 2 self-check questions (**Q1.** ...), found {questions}"


@pytest.mark.parametrize("path", TEACHING_CHAPTERS, ids=ids(TEACHING_CHAPTERS))
def test_summary_after_the_self_check(path):
    grouped = sections(path)
    names = list(grouped)
    assert "Summary" in grouped, "no '## Summary' section"
    assert names.index("Summary") > names.index("Self-check"), (
        "Summary comes after the Self-check"
    )
    bullets = [
        line
        for cell in grouped["Summary"]
        if cell["cell_type"] == "markdown"
        for line in text(cell).splitlines()
        if line.startswith(("- ", "* "))
    ]
    assert 4 <= len(bullets) <= 6, f"a Summary has 4-6 bullet lines, found {len(bullets)}"


# A chapter that links the next one while that one is written on another branch (it joins
# CHAPTERS when it lands, and this exception no longer applies).
LINKS_AHEAD = {"14_size_your_own_model": "15_your_traffic.ipynb"}


@pytest.mark.parametrize("path", CHAPTERS, ids=ids(CHAPTERS))
def test_next_link_points_at_the_next_chapter(path):
    markdown = [cell for cell in cells(path) if cell["cell_type"] == "markdown"]
    appendix = [i for i, cell in enumerate(markdown) if text(cell).startswith("## Appendix")]
    if appendix and "**Next:**" in text(markdown[appendix[-1] - 1]):
        markdown = markdown[: appendix[-1]]  # the Next link closes the main line, before it
    links = re.findall(r"\*\*Next:\*\* \[[^\]]+\]\(([^)]+)\)", text(markdown[-1]))
    position = CHAPTERS.index(path)
    if path.stem in LINKS_AHEAD and not (NOTEBOOKS / LINKS_AHEAD[path.stem]).exists():
        assert links == [LINKS_AHEAD[path.stem]]
    elif position == len(CHAPTERS) - 1:
        assert not links, "the last chapter has no Next link"
    else:
        assert links == [CHAPTERS[position + 1].name], (
            f"the last markdown cell must link **Next:** [..]({CHAPTERS[position + 1].name})"
        )


@pytest.mark.parametrize("path", CHAPTERS, ids=ids(CHAPTERS))
def test_no_seed_in_reader_visible_text(path):
    for index, cell in enumerate(cells(path)):
        for visible in (text(cell), output_text(cell)):
            leftover = ALLOWED_SEED.sub("", visible)
            match = ANY_SEED.search(leftover)
            assert match is None, (
                f"cell {index} says "
                f"{leftover[max(0, match.start() - 40) : match.end() + 40]!r}: cite the "
                "article by title instead of 'seed'"
            )


# --- checks added by issue 26
# --------------------------------------------------------------------- Each list names the
# chapters that do not meet the rule yet (none today). The marks are strict: a chapter that
# meets it fails as XPASS until its name is removed, so the lists only shrink.
MAX_CODE_LINE = 100  # characters: what a laptop-width JupyterLab shows without clipping
LONG_LINES_PENDING: set[str] = set()
REVEAL_PENDING: set[str] = set()


def pending(paths: list[Path], names: set[str], reason: str) -> list:
    """`paths` as test parameters, those named in `names` marked as a strict expected
    failure."""
    unknown = names - {path.stem for path in paths}
    assert not unknown, f"pending list names no chapter: {sorted(unknown)}"
    return [
        pytest.param(path, id=path.stem, marks=pytest.mark.xfail(strict=True, reason=reason))
        if path.stem in names
        else pytest.param(path, id=path.stem)
        for path in paths
    ]


@pytest.mark.parametrize(
    "path", pending(CHAPTERS, LONG_LINES_PENDING, "long code lines not yet wrapped")
)
def test_code_lines_fit_a_laptop_screen(path):
    long = [
        (index, len(line))
        for index, cell in enumerate(cells(path))
        if cell["cell_type"] == "code"
        for line in text(cell).splitlines()
        if len(line) > MAX_CODE_LINE
    ]
    assert not long, (
        f"code lines longer than {MAX_CODE_LINE} characters (cell, length): {long}"
    )


@pytest.mark.parametrize(
    "path", pending(CHAPTERS, REVEAL_PENDING, "self-check answers not yet in reveal()")
)
def test_reveal_cells_show_only_a_closed_answer_box(path):
    """A '# Reveal' cell shows exactly one closed <details> box (refimpl.viz.reveal): nothing
    of the answer is on screen before the reader opens it, and its text/plain is what nbval
    compares."""
    for index, cell in enumerate(cells(path)):
        if cell["cell_type"] != "code" or not text(cell).startswith("# Reveal"):
            continue
        outputs = cell.get("outputs", [])
        kinds = [(o["output_type"], sorted(o.get("data", {}))) for o in outputs]
        assert len(outputs) == 1 and outputs[0]["output_type"] == "display_data", (
            f"cell {index}: a reveal cell's only output is the answer box from `with "
            f"reveal():`, found {kinds}"
        )
        data = outputs[0]["data"]
        assert "".join(data.get("text/html", "")).startswith("<details>"), (
            f"cell {index}: text/html is not a <details> box"
        )
        assert "".join(data.get("text/plain", "")).strip(), (
            f"cell {index}: the answer's text/plain is empty"
        )


def test_the_two_checks_above_pass_a_good_chapter_and_fail_a_bad_one(tmp_path):
    """The pending lists cover every chapter today, so check the checks on notebooks made
    here."""
    from refimpl.viz.reveal import Answer

    answer = Answer("42")
    box = {
        "output_type": "display_data",
        "metadata": {},
        "data": {"text/plain": repr(answer), "text/html": answer._repr_html_()},
    }

    def notebook(source: str, outputs: list) -> Path:
        path = tmp_path / f"nb{len(list(tmp_path.iterdir()))}.ipynb"
        cell = {
            "cell_type": "code",
            "source": source,
            "outputs": outputs,
            "metadata": {},
            "execution_count": 1,
        }
        path.write_text(json.dumps({"cells": [cell]}), encoding="utf-8")
        return path

    test_reveal_cells_show_only_a_closed_answer_box(
        notebook("# Reveal Q1\nwith reveal():\n    print(42)", [box])
    )
    test_code_lines_fit_a_laptop_screen(notebook("x = 1  # " + "." * 90, []))
    printed = {"output_type": "stream", "name": "stdout", "text": "42\n"}
    for bad in (
        [printed],
        [box, box],
        [{**box, "data": {"text/plain": "42", "text/html": "<b>42</b>"}}],
    ):
        with pytest.raises(AssertionError):
            test_reveal_cells_show_only_a_closed_answer_box(
                notebook("# Reveal Q1\nprint(42)", bad)
            )
    with pytest.raises(AssertionError, match="longer than 100"):
        test_code_lines_fit_a_laptop_screen(notebook("x = 1  # " + "." * 92, []))


# --- Part II's running example, and planners named for what they are
# Chapters 08a-13 teach on one running example, Pro's first five layers
# (refimpl.course.hybrid_toy): its specs at Pro's sizes (`toy_v4_specs`) or the same layers as
# a tiny model (`make_tiny_toy`). Pro itself may appear as the real-size case, but each chapter's
# lesson calls one of these before its Self-check, so a reader meets the same layers, groups
# and numbers from chapter to chapter.
PART_II = [
    path
    for path in CHAPTERS
    if path.stem.split("_")[0] in {"08a", "08b", "09", "10", "11", "12", "13"}
]
RUNNING_EXAMPLE_MODULE = "refimpl.course.hybrid_toy"
RUNNING_EXAMPLE = {"toy_v4_specs", "make_tiny_toy"}
# chapter 12's manager over the running example's groups (built from `toy_v4_specs`, tested in
# tests/test_hybrid_simulate.py), called as `hybrid_simulate.toy_kv_cache_manager(...)`
RUNNING_EXAMPLE_MANAGER = ("hybrid_simulate", "toy_kv_cache_manager")
# "planner B" and its kin are aliases: the reader must see what the planner is close by.
PLANNER_LETTER = re.compile(r"\b[Pp]lanners? (?:[ABC]|V0)\b")
PLANNER_NAMES = ("the article's planner", "vLLM's planner", "vLLM's older planner")
PLANNER_NEARBY = 300  # characters either side, in the same cell's source or output


def before_self_check(path_cells: list[dict]) -> list[dict]:
    for index, cell in enumerate(path_cells):
        if cell["cell_type"] == "markdown" and re.search(
            r"^## Self-check", text(cell), flags=re.M
        ):
            return path_cells[:index]
    return path_cells


def check_running_example(path_cells: list[dict]) -> None:
    """A code cell before the Self-check calls the running example's constructor, imported
    from refimpl.course.hybrid_toy (not a look-alike defined in the notebook)."""
    import ast

    imported, called = set(), set()
    for cell in path_cells:
        if cell["cell_type"] != "code":
            continue
        tree = ast.parse(
            "\n".join(
                line
                for line in text(cell).splitlines()
                if not line.lstrip().startswith(("%", "!"))
            )
        )
        for node in ast.walk(tree):
            if isinstance(node, ast.ImportFrom) and node.module == RUNNING_EXAMPLE_MODULE:
                imported |= {alias.asname or alias.name for alias in node.names}
    for cell in before_self_check(path_cells):
        if cell["cell_type"] != "code":
            continue
        for node in ast.walk(ast.parse(text(cell))):
            if not isinstance(node, ast.Call):
                continue
            func = node.func
            if isinstance(func, ast.Name) and func.id in RUNNING_EXAMPLE & imported:
                called.add(func.id)
            elif isinstance(func, ast.Attribute) and isinstance(func.value, ast.Name):
                if (func.value.id == "hybrid_toy" and func.attr in RUNNING_EXAMPLE) or (
                    func.value.id,
                    func.attr,
                ) == RUNNING_EXAMPLE_MANAGER:
                    called.add(func.attr)
    assert called, (
        "no code cell before the Self-check calls the running example "
        f"({' or '.join(sorted(RUNNING_EXAMPLE))} from {RUNNING_EXAMPLE_MODULE})"
    )


def check_planner_names(path_cells: list[dict]) -> None:
    """Every 'planner B' (A, C, V0) a reader sees has the planner's name within
    PLANNER_NEARBY characters of the same cell's source or output."""
    for index, cell in enumerate(path_cells):
        for visible in (text(cell), output_text(cell)):
            for match in PLANNER_LETTER.finditer(visible):
                near = visible[
                    max(0, match.start() - PLANNER_NEARBY) : match.end() + PLANNER_NEARBY
                ]
                assert any(name in near for name in PLANNER_NAMES), (
                    f"cell {index}: {match.group(0)!r} with no {' / '.join(PLANNER_NAMES)!r} "
                    "nearby: name the planner for what it is, the letter is only its alias"
                )


@pytest.mark.parametrize("path", PART_II, ids=ids(PART_II))
def test_part_two_teaches_on_the_running_example(path):
    check_running_example(cells(path))


@pytest.mark.parametrize("path", CHAPTERS, ids=ids(CHAPTERS))
def test_planners_are_named_for_what_they_are(path):
    check_planner_names(cells(path))


def test_the_part_two_checks_pass_a_good_chapter_and_fail_a_bad_one():
    from refimpl.course import hybrid_toy

    assert len(PART_II) == 7
    assert all(callable(getattr(hybrid_toy, name)) for name in RUNNING_EXAMPLE)

    def md(source: str) -> dict:
        return {"cell_type": "markdown", "source": source, "metadata": {}}

    def code(source: str, printed: str = "") -> dict:
        outputs = [{"output_type": "stream", "name": "stdout", "text": printed}]
        return {"cell_type": "code", "source": source, "metadata": {}, "outputs": outputs}

    imports = code("from refimpl.course.hybrid_toy import toy_v4_specs\nimport refimpl")
    good = [
        imports,
        md("## 1. Groups\n\nvLLM's planner (planner C here) groups the running example:"),
        code("groups = get_kv_cache_groups(toy_v4_specs())"),
        md("## Self-check"),
    ]
    check_running_example(good)
    check_planner_names(good)
    check_running_example(
        [
            code("from refimpl.course import hybrid_toy"),
            code("specs = hybrid_toy.make_tiny_toy(path)"),
            md("## Self-check"),
        ]
    )
    bad_example = [
        [imports, code("specs = kv_cache_specs('pro')"), md("## Self-check")],  # Pro only
        [imports, md("## Self-check"), code("# Reveal Q1\ntoy_v4_specs()")],  # only after
        [code("def toy_v4_specs():\n    return {}"), code("toy_v4_specs()")],  # a look-alike
        [code("from refimpl.course.hybrid_toy import TOY_LAYERS"), code("TOY_LAYERS")],
    ]
    for number, bad in enumerate(bad_example):
        with pytest.raises(AssertionError, match="running example"):
            check_running_example(bad)
            pytest.fail(f"bad running-example chapter {number} passed")
    bad_names = [
        [md("Planner B groups the caches by block size.")],
        [md("The planners B and C agree on Pro.")],
        [code("print(1)", "planner C: 5 groups, stride 1,435,968 B\n")],
        [md("The article's planner" + " and more words" * 30 + ", planner B, differs.")],
    ]
    for number, bad in enumerate(bad_names):
        with pytest.raises(AssertionError, match="name the planner"):
            check_planner_names(bad)
            pytest.fail(f"bad planner-name chapter {number} passed")


# Issue 37 item 6: every chapter ends its main line with a `## Next` section, and a chapter
# that an exercise follows sends the reader there, naming what it grades and how long it takes.
# Chapter -> exercise number (a tuple of chapters: either one may send the reader there).
EXERCISE_AFTER: dict[str | tuple[str, ...], int] = {
    "03_block_manager": 1,
    "04_prefix_cache": 2,
    "05_scheduler": 3,
    ("09_v4_grouping", "10_v4_memory_slab"): 4,
    "12_hybrid_allocator": 5,
    "11_v4_addressing": 6,
}
# Chapters their owners have not converted yet (strict xfail: remove a name once it passes).
NEXT_PENDING: set[str] = set()
EXERCISE_PENDING: set[str | tuple[str, ...]] = set()


def pending(stem, names) -> list:
    if stem in names:
        return [pytest.mark.xfail(strict=True, reason=f"{stem} is not converted yet")]
    return []


@pytest.mark.parametrize(
    "path",
    [pytest.param(p, id=p.stem, marks=pending(p.stem, NEXT_PENDING)) for p in CHAPTERS[:-1]],
)
def test_the_next_link_sits_in_a_next_section(path):
    grouped = sections(path)
    assert "Next" in grouped, "no '## Next' section"
    assert any("**Next:**" in text(cell) for cell in grouped["Next"]), (
        "the **Next:** link belongs in the '## Next' section"
    )


@pytest.mark.parametrize(
    ("stems", "number"),
    [
        pytest.param(stems, number, id=str(stems), marks=pending(stems, EXERCISE_PENDING))
        for stems, number in EXERCISE_AFTER.items()
    ],
)
def test_a_chapter_sends_the_reader_to_its_exercise(stems, number):
    stems = stems if isinstance(stems, tuple) else (stems,)
    exercise = next((NOTEBOOKS / "exercises").glob(f"{number:02d}_*.ipynb"))
    for stem in stems:
        nexts = sections(NOTEBOOKS / f"{stem}.ipynb").get("Next", [])
        found = "\n".join(text(cell) for cell in nexts)
        if f"**Now do exercise {number}**" in found:
            link = f"](exercises/{exercise.name})"
            assert link in found, f"{stem}: link the exercise: [..](exercises/{exercise.name})"
            assert re.search(r"about \d+ minutes", found), f"{stem}: say how long it takes"
            return
    pytest.fail(
        f"no '**Now do exercise {number}**' in the Next section of {' or '.join(stems)}"
    )
