"""Step through the scheduler loop by name: frames recorded from real `schedule` /
`postprocess` calls.

Each engine step becomes two frames: one right after `Scheduler.schedule()` (what the step
picked, the blocks it allocated) and one after the model ran and `Scheduler.postprocess()`
recorded the result (tokens now cached, finished requests freed). A frame is a
`SchedulerState`: an immutable snapshot of the queues, every named request's block table and
token counts, and the free blocks, so `refimpl.viz.Stepper` can play the frames and a test can
compare them with freshly stepped objects. Requests are shown by name ("A", "B", ...), never by
their global `seq_id`.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import dataclass

from matplotlib.figure import Figure
from matplotlib.patches import Patch, Rectangle

from refimpl.course.runners import FakeModelRunner
from refimpl.paged.scheduler import Scheduler
from refimpl.paged.sequence import Sequence
from refimpl.viz.palette import EMPTY, MAX_WIDTH, SEQ_COLORS
from refimpl.viz.stepper import Frame, record_frames


@dataclass(frozen=True)
class RequestState:
    """One request at one moment: its status, token counts and block table."""

    name: str
    status: str  # WAITING, RUNNING, FINISHED, or "-" before the request was added
    num_tokens: int  # prompt + sampled tokens so far
    # tokens whose K/V is in the cache (computed or served by the prefix cache)
    num_cached_tokens: int
    num_scheduled_tokens: int  # tokens the current step computes (0 outside a step)
    block_table: tuple[int, ...]
    completion: tuple[int, ...]


@dataclass(frozen=True)
class SchedulerState:
    """The scheduler seen by name after one call; `batch` is what the latest `schedule()`
    picked."""

    phase: str  # "start", "schedule" or "postprocess"
    is_prefill: bool | None  # kind of the latest step (None before the first)
    batch: tuple[tuple[str, int], ...]  # (name, tokens to compute) in batch order
    preempted: tuple[str, ...]  # preempted by the latest schedule()
    finished: tuple[str, ...]  # finished by the latest postprocess()
    waiting: tuple[str, ...]
    running: tuple[str, ...]
    requests: tuple[RequestState, ...]  # in name order
    num_free_blocks: int
    num_blocks: int


class SchedulerRecorder:
    """Drives one scheduler step by step with a fake model and snapshots it by request name.

    The requests must already be queued with `Scheduler.add` (or be added later through `add`).
    """

    def __init__(
        self, scheduler: Scheduler, runner: FakeModelRunner, requests: dict[str, Sequence]
    ) -> None:
        if not requests:
            raise ValueError("SchedulerRecorder needs at least one named request")
        names = list(requests)
        if len(set(id(seq) for seq in requests.values())) != len(names):
            raise ValueError("each name must stand for a different Sequence")
        self.scheduler = scheduler
        self.runner = runner
        self.requests = dict(requests)
        self._phase = "start"
        self._batch: list[Sequence] = []
        self._is_prefill: bool | None = None
        self._scheduled: tuple[tuple[str, int], ...] = ()
        self._finished: tuple[str, ...] = ()

    def name(self, seq: Sequence) -> str:
        for name, known in self.requests.items():
            if known is seq:
                return name
        raise ValueError(f"sequence {seq.seq_id} has no name in this recorder")

    def _names(self, seqs) -> tuple[str, ...]:
        return tuple(self.name(seq) for seq in seqs)

    def snapshot(self) -> SchedulerState:
        """The current state, as an immutable value."""
        bm = self.scheduler.block_manager
        by_id = {seq.seq_id: name for name, seq in self.requests.items()}
        queued = {id(seq) for seq in self.scheduler.waiting} | {
            id(seq) for seq in self.scheduler.running
        }

        def status(seq: Sequence) -> str:
            return (
                "-"
                if seq.status.name == "WAITING" and id(seq) not in queued
                else seq.status.name
            )

        return SchedulerState(
            phase=self._phase,
            is_prefill=self._is_prefill,
            batch=self._scheduled,
            preempted=tuple(by_id[i] for i in self.scheduler.preempted_last_step)
            if self._phase == "schedule"
            else (),
            finished=self._finished,
            waiting=self._names(self.scheduler.waiting),
            running=self._names(self.scheduler.running),
            requests=tuple(
                RequestState(
                    name,
                    status(seq),
                    seq.num_tokens,
                    seq.num_cached_tokens,
                    seq.num_scheduled_tokens,
                    tuple(seq.block_table),
                    tuple(seq.completion_token_ids),
                )
                for name, seq in sorted(self.requests.items())
            ),
            num_free_blocks=len(bm.free_block_ids),
            num_blocks=bm.num_blocks,
        )

    def add(self, name: str) -> None:
        """`Scheduler.add` for a named request that arrives later."""
        self.scheduler.add(self.requests[name])

    def schedule(self) -> None:
        """`Scheduler.schedule()`: the first half of an engine step."""
        self._batch, self._is_prefill = self.scheduler.schedule()
        self._scheduled = tuple(
            (self.name(seq), seq.num_scheduled_tokens) for seq in self._batch
        )
        self._finished = ()
        self._phase = "schedule"

    def postprocess(self) -> None:
        """The model runs on the batch, then `Scheduler.postprocess` records the sampled
        tokens."""
        if self._phase != "schedule":
            raise ValueError("postprocess() needs a schedule() first")
        token_ids = self.runner.run(self._batch, self._is_prefill)
        done = self.scheduler.postprocess(self._batch, token_ids, self._is_prefill)
        self._finished = tuple(self.name(seq) for seq, d in zip(self._batch, done) if d)
        self._phase = "postprocess"

    def actions(
        self, arrivals: dict[int, list[str]] | None = None, max_steps: int = 100
    ) -> Iterator[tuple[str, Callable[[], None]]]:
        """Labelled actions until both queues are empty: schedule, postprocess, schedule, ...

        `arrivals={k: ["C"]}` adds C just before step k's schedule() (the arrival is part of
        that frame).
        """
        arrivals = dict(arrivals or {})
        step = 0
        while not self.scheduler.is_finished() or arrivals.get(step):
            if step >= max_steps:
                raise ValueError(f"still not finished after {max_steps} steps")
            late = arrivals.pop(step, [])

            def schedule(late=late):
                for name in late:
                    self.add(name)
                self.schedule()

            joined = (
                f" ({', '.join(late)} {'arrives' if len(late) == 1 else 'arrive'})"
                if late
                else ""
            )
            yield f"step {step}: schedule(){joined}", schedule
            yield f"step {step}: run + postprocess()", self.postprocess
            step += 1


def scheduler_frames(
    scheduler: Scheduler,
    runner: FakeModelRunner,
    requests: dict[str, Sequence],
    arrivals: dict[int, list[str]] | None = None,
) -> list[Frame[SchedulerState]]:
    """Run the scheduler to the end with a fake model; one frame after every schedule() and
    postprocess()."""
    recorder = SchedulerRecorder(scheduler, runner, requests)
    return record_frames(recorder.snapshot, recorder.actions(arrivals))


def scheduler_state_text(state: SchedulerState) -> str:
    """The frame as text: the step's batch, the queues, the free blocks and one line per
    request."""
    if state.phase == "start":
        did = "nothing scheduled yet"
    else:
        kind = "prefill" if state.is_prefill else "decode"
        batch = " ".join(f"{name}:{n}" for name, n in state.batch)
        did = f"{kind} batch {batch}"
        if state.preempted:
            did += f" | preempted {' '.join(state.preempted)}"
        if state.finished:
            did += f" | finished {' '.join(state.finished)}"
    lines = [
        did,
        f"waiting [{', '.join(state.waiting)}]  running [{', '.join(state.running)}]  "
        f"free blocks {state.num_free_blocks}/{state.num_blocks}",
    ]
    for r in state.requests:
        step = f" +{r.num_scheduled_tokens} this step" if r.num_scheduled_tokens else ""
        lines.append(
            f"  {r.name}  {r.status:<8} tokens {r.num_tokens:>2}  cached "
            f"{r.num_cached_tokens:>2}{step:<14} "
            f"table {list(r.block_table)}"
        )
    return "\n".join(line.rstrip() for line in lines)


def draw_scheduler_state(state: SchedulerState) -> Figure:
    """The pool as a row of numbered blocks coloured by the requests that hold them, and the
    queues.

    A block held by several requests (a prefix-cache hit) is split into one band per holder.
    """
    names = [r.name for r in state.requests]
    color = {name: SEQ_COLORS[i % len(SEQ_COLORS)] for i, name in enumerate(names)}
    holders: dict[int, list[str]] = {}
    for r in state.requests:
        for block_id in r.block_table:
            holders.setdefault(block_id, []).append(r.name)
    n = state.num_blocks
    fig = Figure(figsize=(min(MAX_WIDTH, max(6.0, 0.55 * n + 1.5)), 2.6), layout="constrained")
    grid = fig.add_gridspec(2, 1, height_ratios=[1.0, 1.25])
    ax = fig.add_subplot(grid[0])
    for block_id in range(n):
        owners = holders.get(block_id, [])
        if not owners:
            ax.add_patch(
                Rectangle(
                    (block_id, 0), 1, 1, facecolor=EMPTY, edgecolor="black", linewidth=0.8
                )
            )
        for k, owner in enumerate(owners):
            band = 1 / len(owners)
            ax.add_patch(
                Rectangle(
                    (block_id, 1 - (k + 1) * band),
                    1,
                    band,
                    facecolor=color[owner],
                    edgecolor="none",
                )
            )
        ax.add_patch(
            Rectangle((block_id, 0), 1, 1, facecolor="none", edgecolor="black", linewidth=0.8)
        )
        ax.text(block_id + 0.5, 1.12, str(block_id), ha="center", va="bottom", fontsize=8)
        ax.text(
            block_id + 0.5,
            0.5,
            "+".join(owners) if owners else "free",
            ha="center",
            va="center",
            fontsize=8,
            color="white" if owners else "#555555",
        )
    ax.set_xlim(-0.1, n + 0.1)
    ax.set_ylim(-0.05, 1.45)
    ax.axis("off")
    ax.set_title(
        f"block pool: {n - state.num_free_blocks} in use, {state.num_free_blocks} free "
        "(numbers above: block ids)",
        fontsize=9,
        loc="left",
    )
    handles = [Patch(facecolor=color[name], label=f"held by {name}") for name in names]
    handles.append(Patch(facecolor=EMPTY, edgecolor="black", label="free"))
    ax.legend(
        handles=handles, loc="upper left", bbox_to_anchor=(1.0, 1.0), fontsize=8, frameon=False
    )
    text_ax = fig.add_subplot(grid[1])
    text_ax.axis("off")
    text_ax.text(
        0.0,
        1.0,
        scheduler_state_text(state),
        family="monospace",
        fontsize=8,
        va="top",
        ha="left",
        transform=text_ax.transAxes,
    )
    return fig
