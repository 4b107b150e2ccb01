"""refimpl.course.build_check: stubs are told by bytecode, and a difference is shown at its
first step and first index, with the elements around it."""

from __future__ import annotations

import pytest

from refimpl.course.build_check import check_build, describe_difference, first_stub, is_stub


def stub_function(x: int) -> int:
    """Only a docstring and an ellipsis: a stub."""
    ...


def bare_stub(x): ...


def written(x: int) -> int:
    """Written."""
    return x + 1


def returns_none(x):
    print(x)


class StubClass:
    def __init__(self) -> None:
        self.items: list[int] = []

    def first(self) -> None:
        """Written first."""
        ...

    @property
    def second(self) -> int:
        """A property stub."""
        ...


class HalfWritten(StubClass):
    def first(self) -> None:
        self.items.append(1)

    @property
    def second(self) -> int:
        """A property stub."""
        ...


class Written(StubClass):
    def first(self) -> None:
        self.items.append(1)

    @property
    def second(self) -> int:
        return len(self.items)


def test_is_stub_reads_the_bytecode_not_the_source():
    assert is_stub(stub_function) and is_stub(bare_stub)
    assert not is_stub(written) and not is_stub(returns_none)
    assert is_stub(vars(StubClass)["second"])  # a property: its getter
    assert not is_stub(len)  # a builtin has no bytecode to compare
    namespace: dict = {}
    exec("def f(a):\n    '''doc'''\n    # a comment\n    ...\n", namespace)
    assert is_stub(namespace["f"])
    exec("def g(a):\n    return None  # written, but does nothing\n", namespace)
    assert is_stub(namespace["g"])  # the same bytecode as an empty body: still to write


def test_first_stub_names_the_first_method_still_to_write():
    assert first_stub(StubClass) == "StubClass.first"
    assert first_stub(HalfWritten) == "HalfWritten.second"
    assert first_stub(Written) is None
    assert first_stub((written, stub_function)) == "stub_function"
    assert first_stub((written, Written)) is None


def steps_of(function):
    def run(built, case):
        for x in case:
            yield f"f({x})", built(x)

    return run


def reference(case):
    for x in case:
        yield f"f({x})", x + 1


def test_a_stub_prints_one_line_and_passes(capsys):
    check_build(stub_function, {"one": [1]}, run=steps_of(None), reference=reference)
    out = capsys.readouterr().out
    assert out == "stub_function is still a stub: write it, then run this cell again.\n"


def test_a_right_version_prints_one_short_line(capsys):
    check_build(written, {"a": [1, 2], "b": [3]}, run=steps_of(None), reference=reference)
    assert capsys.readouterr().out == "written matches the package: 2 cases, 3 steps.\n"


def test_a_wrong_version_fails_at_its_first_differing_step(capsys):
    def off_by_one_at_three(x):
        return x + 1 if x != 3 else x

    with pytest.raises(AssertionError, match=r"case 'b', f\(3\)"):
        check_build(
            off_by_one_at_three,
            {"a": [1, 2], "b": [2, 3, 4]},
            run=steps_of(None),
            reference=reference,
        )
    out = capsys.readouterr().out
    assert "case 'b', f(3): your version differs" in out
    assert "expected 4, found 3" in out


def test_an_exception_in_the_readers_version_names_the_step(capsys):
    def raises_at_two(x):
        if x == 2:
            raise KeyError("no such request")
        return x + 1

    with pytest.raises(AssertionError, match="raised KeyError"):
        check_build(raises_at_two, {"a": [1, 2]}, run=steps_of(None), reference=reference)
    assert "case 'a', f(2) (after 'f(1)')" in capsys.readouterr().out


def test_too_few_or_too_many_steps_fail():
    def run_short(built, case):
        yield from list(steps_of(None)(built, case))[:-1]

    def run_long(built, case):
        yield from steps_of(None)(built, case)
        yield "extra", 0

    with pytest.raises(AssertionError, match=r"stopped before f\(2\)"):
        check_build(written, {"a": [1, 2]}, run=run_short, reference=reference)
    with pytest.raises(AssertionError, match="past the end"):
        check_build(written, {"a": [1, 2]}, run=run_long, reference=reference)


def test_a_long_list_shows_the_first_differing_index_with_its_neighbours():
    expected = list(range(100))
    found = list(range(100))
    found[57] = -1
    lines = describe_difference({"free": expected}, {"free": found})
    text = "\n".join(lines)
    assert "['free']: first difference at index 57" in text
    assert ">[57] 57" in text and ">[57] -1" in text
    assert "[55] 55" in text and "[59] 59" in text  # the neighbours, both sides
    assert all(len(line) <= 100 for line in lines)


def test_a_shorter_list_says_where_it_ends():
    text = "\n".join(describe_difference([1, 2, 3], [1, 2]))
    assert "first difference at index 2" in text
    assert "nothing: the list ends before it" in text


def test_nested_tables_name_the_innermost_difference():
    expected = {"A": [0, 1, 2], "B": [0, 1, 3, 4]}
    found = {"A": [0, 1, 2], "B": [0, 1, 4, 3]}
    text = "\n".join(describe_difference(expected, found))
    assert "['B']: first difference at index 2" in text
    assert describe_difference({"A": [1]}, {}) == ["['A']: expected [1], found no key"]
    assert describe_difference(expected, expected) == []


def test_wide_elements_keep_the_lines_under_100_columns():
    expected = [("A", 11, list(range(20))), ("B", 13, list(range(30)))]
    found = expected + [("C", 11, list(range(40)))]
    lines = describe_difference(expected, found)
    assert max(len(line) for line in lines) <= 96, lines
    assert ">[2] ('C', 11" in "\n".join(lines)


def test_atol_lets_float_results_of_another_summation_order_match():
    from refimpl.course.build_check import same

    assert same([0.1 + 0.2, {"x": 1.0}], [0.3, {"x": 1.0 + 1e-9}], atol=1e-6)
    assert not same([0.1 + 0.2], [0.3])  # exact by default
    assert not same([1.0, 2.0], [1.0, 2.1], atol=1e-6)
    assert not same([1.0], [1.0, 2.0], atol=1e-6)
    lines = describe_difference([1.0, 2.0, 3.0], [1.0 + 1e-9, 2.5, 3.0], atol=1e-6)
    assert lines[0] == "list: first difference at index 1"
    with pytest.raises(AssertionError):
        check_build(
            lambda x: x + 1.5,
            {"a": [1]},
            run=steps_of(None),
            reference=reference,
            atol=1e-6,
        )
