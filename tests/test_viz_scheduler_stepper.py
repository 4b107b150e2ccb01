"""The scheduler stepper's frames are the states of a real Scheduler stepped afresh, shown by
name."""

from __future__ import annotations

import itertools

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from matplotlib.figure import Figure

from refimpl.course import running_example as example
from refimpl.course.runners import FakeModelRunner, SchedulerDriver
from refimpl.paged import Scheduler, SchedulerConfig, Sequence
from refimpl.viz import Stepper
from refimpl.viz.scheduler_stepper import (
    SchedulerRecorder,
    draw_scheduler_state,
    scheduler_frames,
    scheduler_state_text,
)
from refimpl.viz.timeline import draw_timeline, timeline_text


@pytest.fixture(autouse=True)
def fresh_seq_ids(monkeypatch):
    monkeypatch.setattr(Sequence, "counter", itertools.count())


def setup(num_blocks=12, max_tokens=3, budget=16384):
    scheduler = Scheduler(
        SchedulerConfig(
            num_kvcache_blocks=num_blocks, kvcache_block_size=4, max_num_batched_tokens=budget
        )
    )
    return (
        scheduler,
        FakeModelRunner.for_scheduler(scheduler),
        example.requests(max_tokens=max_tokens),
    )


def expected_state(scheduler, seqs):
    """What a frame must say, read straight off the real objects."""
    name = {seq.seq_id: n for n, seq in seqs.items()}
    return (
        tuple(name[s.seq_id] for s in scheduler.waiting),
        tuple(name[s.seq_id] for s in scheduler.running),
        tuple(
            (
                n,
                s.num_tokens,
                s.num_cached_tokens,
                s.num_scheduled_tokens,
                tuple(s.block_table),
                tuple(s.completion_token_ids),
            )
            for n, s in sorted(seqs.items())
        ),
        len(scheduler.block_manager.free_block_ids),
    )


def frame_state(state):
    return (
        state.waiting,
        state.running,
        tuple(
            (
                r.name,
                r.num_tokens,
                r.num_cached_tokens,
                r.num_scheduled_tokens,
                r.block_table,
                r.completion,
            )
            for r in state.requests
        ),
        state.num_free_blocks,
    )


def check_frames_against_fresh_run(num_blocks, max_tokens, budget, arrivals):
    scheduler, runner, seqs = setup(num_blocks, max_tokens, budget)
    first = [n for n in seqs if not any(n in late for late in arrivals.values())]
    for n in first:
        scheduler.add(seqs[n])
    frames = scheduler_frames(scheduler, runner, seqs, arrivals=dict(arrivals))

    # The same calls by hand on fresh objects, compared after every call.
    fresh, fresh_runner, fresh_seqs = setup(num_blocks, max_tokens, budget)
    for n in first:
        fresh.add(fresh_seqs[n])
    assert frame_state(frames[0].state) == expected_state(fresh, fresh_seqs)
    index, step = 1, 0
    while not fresh.is_finished() or step in arrivals:
        for n in arrivals.get(step, []):
            fresh.add(fresh_seqs[n])
        batch, is_prefill = fresh.schedule()
        state = frames[index].state
        assert frame_state(state) == expected_state(fresh, fresh_seqs)
        assert state.is_prefill == is_prefill
        assert [b for b, _ in state.batch] == [
            n for s in batch for n, q in fresh_seqs.items() if q is s
        ]
        fresh.postprocess(batch, fresh_runner.run(batch, is_prefill), is_prefill)
        assert frame_state(frames[index + 1].state) == expected_state(fresh, fresh_seqs)
        index, step = index + 2, step + 1
    assert index == len(frames)


def test_running_example_frames_equal_a_fresh_run():
    check_frames_against_fresh_run(12, 3, 16384, {1: ["B", "C"]})


@settings(max_examples=25, deadline=None)
@given(
    num_blocks=st.integers(5, 14),
    max_tokens=st.integers(1, 6),
    budget=st.integers(4, 30),
    late=st.sampled_from([{}, {1: ["C"]}, {1: ["B", "C"]}, {2: ["C"]}]),
)
def test_frames_equal_a_fresh_run_under_pressure(num_blocks, max_tokens, budget, late):
    # small pools preempt, small budgets chunk: the frames still follow the real objects
    # exactly
    check_frames_against_fresh_run(num_blocks, max_tokens, budget, late)


def test_running_example_text_and_picture():
    scheduler, runner, seqs = setup()
    scheduler.add(seqs["A"])
    frames = scheduler_frames(scheduler, runner, seqs, arrivals={1: ["B", "C"]})
    assert [f.label for f in frames[:4]] == [
        "start",
        "step 0: schedule()",
        "step 0: run + postprocess()",
        "step 1: schedule() (B, C arrive)",
    ]
    text = scheduler_state_text(frames[3].state)
    assert text.splitlines()[:2] == [
        "prefill batch B:5 C:3",
        "waiting []  running [A, B, C]  free blocks 6/12",
    ]
    assert "  C  RUNNING  tokens 11  cached  8 +3 this step  table [0, 1, 5]" in text
    assert scheduler_state_text(frames[0].state).splitlines()[3].split()[:2] == ["B", "-"]
    fig = draw_scheduler_state(frames[3].state)
    assert isinstance(fig, Figure)
    labels = [t.get_text() for t in fig.axes[0].texts]
    assert "A+B+C" in labels and labels.count("free") == 6
    stepper = Stepper(frames, draw_scheduler_state, scheduler_state_text)
    assert stepper.strip_text().count("--- step") == len(frames) == 9


def test_recorder_rejects_bad_use():
    scheduler, runner, seqs = setup()
    with pytest.raises(ValueError, match="at least one"):
        SchedulerRecorder(scheduler, runner, {})
    with pytest.raises(ValueError, match="different Sequence"):
        SchedulerRecorder(scheduler, runner, {"A": seqs["A"], "B": seqs["A"]})
    recorder = SchedulerRecorder(scheduler, runner, seqs)
    with pytest.raises(ValueError, match="schedule"):
        recorder.postprocess()


def test_timeline_by_name_and_legend_lists_only_what_is_shown():
    scheduler = Scheduler(SchedulerConfig(num_kvcache_blocks=12, kvcache_block_size=4))
    seqs = example.requests(max_tokens=2)
    driver = SchedulerDriver(scheduler)
    driver.add([seqs["A"], seqs["B"]])
    driver.step()
    driver.add(seqs["C"])
    driver.run()
    names = example.names_by_seq_id(seqs)
    text = timeline_text(driver.steps, num_blocks=12, names=names)
    assert [line.split() for line in text.splitlines()[1:4]] == [
        "0 prefill A:11 B:13 - - 7/12".split(),
        "1 prefill C:3(+8 cached) - - 8/12".split(),
        "2 decode A:1 B:1 C:1 - A B C 0/12".split(),
    ]
    fig = draw_timeline(driver.steps, num_blocks=12, names=names)
    grid = fig.axes[0]
    assert [t.get_text() for t in grid.get_yticklabels()] == ["A", "B", "C"]
    legend = [t.get_text() for t in grid.get_legend().get_texts()]
    # no chunk and no preemption in this run, so the legend does not list them
    assert legend == [
        "prefill (prompt done)",
        "decode (1 token)",
        "prefix-cache hit (+n cached)",
        "finished",
    ]
    assert all(p.get_hatch() is None for p in grid.patches)
