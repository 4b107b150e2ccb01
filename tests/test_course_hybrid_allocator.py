"""Exercise 5 (the hybrid allocator): its worlds, its answer-free refimpl and its grading.

The graders' rows, rules and broken variants are checked with every other grader's in
test_course_graders.py (the reference passes, each variant fails its rule's scenario); the
solution and student notebooks in test_course_notebooks.py.
"""

from __future__ import annotations

import json
import re
import types
from pathlib import Path

import nbformat
import pytest

import grader as course
from grader.exercises.answer_free import ReferenceUsed, answer_free_sources
from grader.exercises.hybrid_allocator_checks import MINI_V4
from grader.exercises.hybrid_allocator_worlds import HitWorld, WindowWorld, group_specs
from grader.grading import grade_notebook
from refimpl.course.hybrid_simulate import mini_v4_groups
from refimpl.hybrid.block_pool import BlockPool
from refimpl.hybrid.kv_cache_coordinator import HybridKVCacheCoordinator
from refimpl.hybrid.single_type_kv_cache_manager import (
    FullAttentionManager,
    SlidingWindowManager,
)

ROOT = Path(__file__).resolve().parents[1]
SOLUTION = ROOT / "notebooks" / "exercises" / "solutions" / "05_hybrid_allocator.ipynb"


@pytest.fixture(autouse=True)
def _grading_as_root_is_asked_for(monkeypatch):
    """These tests may run as root (a container): they ask for it as an instructor would."""
    monkeypatch.setenv("GRADER_ALLOW_ROOT", "1")


def test_the_graders_toy_is_the_shrunk_running_example():
    chapter = [
        (g.kv_cache_spec.block_size, getattr(g.kv_cache_spec, "sliding_window", None))
        for g in mini_v4_groups()
    ]
    assert [(bs, w) for _, bs, w in MINI_V4] == chapter


def test_in_the_childs_refimpl_full_attention_still_frees_nothing_and_windows_raise():
    """The coordinator asks every group to free its skipped blocks: full attention's answer
    (nothing) must survive the answer-free rewrite, the window's must not."""
    source = answer_free_sources(["check_window_frees"])[
        "refimpl.hybrid.single_type_kv_cache_manager"
    ]
    module = types.ModuleType("answer_free_managers")
    module.__dict__["__reference_used__"] = ReferenceUsed
    exec(compile(source, "<answer-free managers>", "exec"), module.__dict__)
    pool = BlockPool(16)
    full_spec, window_spec = (
        g.kv_cache_spec for g in group_specs([("full", 4, None), ("W", 4, 8)])
    )
    full = module.FullAttentionManager(full_spec, pool, 0)
    full.allocate_new_blocks("r", 12)
    table = list(full.req_to_blocks["r"])
    assert full.remove_skipped_blocks("r", 12) == []
    assert full.req_to_blocks["r"] == table
    window = module.SlidingWindowManager(window_spec, pool, 1)
    window.allocate_new_blocks("r", 12)
    for call in (
        lambda: window.get_num_skipped_tokens(12),
        lambda: window.remove_skipped_blocks("r", 12),
    ):
        with pytest.raises(ReferenceUsed):
            call()


def test_the_window_world_runs_the_students_class_in_every_window_group():
    world = WindowWorld.build(SlidingWindowManager, MINI_V4, 64)
    kinds = [type(m) for m in world.manager.coordinator.single_type_managers]
    assert (
        kinds
        == [SlidingWindowManager] * 2 + [FullAttentionManager] + [SlidingWindowManager] * 2
    )
    world.new("A", list(range(100, 140)))
    assert world.step("A", 16) is not None
    world.step("A", 16)
    # step 2 on the shrunk example: SWA-a reads 3 4 32 31 30 29 after the windows freed first
    assert world.manager.get_block_ids("A")[0] == [0, 0, 3, 4, 32, 31, 30, 29]


def test_the_hit_world_finds_the_shrunk_examples_hit_of_32():
    world = HitWorld.build(HybridKVCacheCoordinator, MINI_V4, 160, None)
    a = list(range(100, 140))
    world.new("A", a)
    world.run("A")
    world.free("A")
    world.new("B", a[:35] + list(range(900, 910)))
    assert world.get_computed_blocks("B")[1] == 32
    assert world.lookup("B", 44)[1:] == (32, 0)


def test_the_childs_refimpl_lacks_exactly_the_answers():
    """In the grading child the asked methods are stubs; what the exercise builds on (the
    window's lookup, full attention's frees, the coordinator's constructor) is kept."""
    sources = answer_free_sources(["check_window_frees", "check_fixed_point_hit"])
    managers, coordinator = (
        sources["refimpl.hybrid.single_type_kv_cache_manager"],
        sources["refimpl.hybrid.kv_cache_coordinator"],
    )
    stubs = {
        "SlidingWindowManager.get_num_skipped_tokens",
        "SingleTypeKVCacheManager.remove_skipped_blocks",
        "SingleTypeKVCacheManager._skipped_blocks",
        "MambaManager.remove_skipped_blocks",
    }
    module = "refimpl.hybrid.single_type_kv_cache_manager"
    for name in stubs:
        assert f"__reference_used__('{module}.{name}')" in managers
    assert managers.count("__reference_used__(") == len(stubs)
    assert "num_computed_tokens - self.sliding_window + 1" not in managers
    assert "table[i] = self._null_block" not in managers
    assert "def find_longest_cache_hit" in managers  # each kind's own lookup stays
    stub = "__reference_used__('refimpl.hybrid.kv_cache_coordinator.HybridKVCacheCoordinator."
    assert coordinator.count("__reference_used__(") == 1
    assert stub + "find_longest_cache_hit')" in coordinator
    assert (
        "eagle_verified" not in coordinator and "def get_kv_cache_coordinator" in coordinator
    )


def _notebook_with(tmp_path: Path, replacements: dict[str, str]) -> Path:
    """The solution notebook with each solution region replaced (by method name)."""
    notebook = nbformat.read(SOLUTION, as_version=4)
    for cell in notebook.cells:
        for method, body in replacements.items():
            if f"def {method}(" in cell.source:
                pattern = re.compile(
                    rf"(def {method}\(.*?\):\n)(\s*### BEGIN SOLUTION\n.*?### END SOLUTION)",
                    re.S,
                )
                cell.source = pattern.sub(
                    lambda m: m.group(1) + "        " + body, cell.source, count=1
                )
    path = tmp_path / "05_hybrid_allocator.ipynb"
    nbformat.write(notebook, path)
    return path


@pytest.mark.slow
def test_command_line_grading_gives_the_honest_solution_full_marks(tmp_path):
    path = tmp_path / "05_hybrid_allocator.ipynb"
    path.write_bytes(SOLUTION.read_bytes())
    grade = grade_notebook(path, timeout=240)
    assert (grade.num_passed, grade.num_checks) == (17, 17), grade.tables


@pytest.mark.slow
def test_command_line_grading_gives_a_submission_calling_the_reference_zero(tmp_path):
    path = _notebook_with(
        tmp_path,
        {
            "get_num_skipped_tokens": "return super().get_num_skipped_tokens(num_computed_tokens)",
            "remove_skipped_blocks": (
                "return super().remove_skipped_blocks(request_id, total_computed_tokens)"
            ),
            "find_longest_cache_hit": (
                "return super().find_longest_cache_hit(block_hashes, max_cache_hit_length)"
            ),
        },
    )
    assert "super().find_longest_cache_hit" in json.dumps(json.loads(path.read_text()))
    grade = grade_notebook(path, timeout=240)
    assert (grade.num_passed, grade.num_checks) == (0, 17), grade.tables
    assert "the reference's refimpl.hybrid" in "\n".join(grade.tables)


def test_the_feedback_grader_names_the_reference_when_a_subclass_delegates():
    class Lazy(HybridKVCacheCoordinator):
        def find_longest_cache_hit(self, block_hashes, max_cache_hit_length):
            return super().find_longest_cache_hit(block_hashes, max_cache_hit_length)

    report = course.check_fixed_point_hit(Lazy, verbose=False)
    assert report.num_passed == 0
    assert (
        "HybridKVCacheCoordinator.find_longest_cache_hit" in report.results[0].divergence.found
    )
