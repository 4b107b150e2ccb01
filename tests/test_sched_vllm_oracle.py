"""refimpl's scheduler replays vLLM 0.32's own `Scheduler`, step for step, without vLLM.

`tests/data/vllm_sched_oracle.json` holds, per setting (dense, sliding window, a DeepSeek
V4-shaped two-group cache, Llama 4's three chunked local groups beside a full one, DeepSeek V4's
real caches: the five groups vLLM's planner makes for `tests/data/configs/tiny-deepseek-v4`,
Llama 4's as vLLM's own model makes them for `tests/data/configs/tiny-llama4`, and two Mamba
hybrids, tiny-granite-h and tiny-jamba, with prefix caching on and off; retention None, 0,
k; chunked or not; async or not; FCFS or priority), the
sha256 digest of vLLM's step log for every fuzzed stream (recorded by
`python -m tools.crosscheck.scheduler --record ...`, which first checks refimpl equal step for
step). A stream is a seed: `tools.crosscheck.sched_streams` expands it again here.

The fast test replays the first streams of every setting; the slow one all of them. Mutants
(a rule undone in a copy of the scheduler's source) must fail the replay.
"""

from __future__ import annotations

import json
import types
from pathlib import Path

import pytest

import refimpl.sched.async_scheduler as async_scheduler_module
import refimpl.sched.scheduler as scheduler_module
from tools.crosscheck.sched_streams import RefimplSide, Setting, digest, drive, make_stream

ORACLE = json.loads((Path(__file__).parent / "data" / "vllm_sched_oracle.json").read_text())
SETTINGS = [(Setting.from_json(e["setting"]), e["digests"]) for e in ORACLE["settings"]]
TOTALS = {e["setting"]["name"]: e["totals"] for e in ORACLE["settings"]}


def replay(setting: Setting, seed: int, scheduler_cls=None) -> str:
    side = RefimplSide(setting, scheduler_cls)
    return digest(
        drive(side, make_stream(seed, setting), setting.async_scheduling, setting.num_spec)
    )


def test_oracle_covers_every_setting():
    names = {s.name for s, _ in SETTINGS}
    assert len(names) == 115  # 26 of them Mamba hybrids' (test_sched_vllm_oracle_mamba)
    for layout in ("dense", "swa", "v4", "llama4", "dsv4", "tiny-llama4"):
        for mode in ("chunk-sync", "chunk-async", "nochunk-sync", "nochunk-async"):
            assert any(n.startswith(layout) and n.endswith(mode) for n in names)
    assert {s.policy for s, _ in SETTINGS} == {"fcfs", "priority"}
    assert {s.retention for s, _ in SETTINGS} == {None, 0, 32, 128, 512}
    assert {s.model for s, _ in SETTINGS} == {
        "",
        "tiny-deepseek-v4",
        "tiny-llama4",
        "tiny-granite-h",
        "tiny-jamba",
    }
    # Llama 4's chunked local layers, retention None and 0 (vLLM refuses k without a
    # window), every scheduling mode: as cache groups (chunks of 32 tokens over 16-token
    # blocks), and as vLLM's own Llama4ForCausalLM builds them for the tiny config (chunks of
    # 256 over the CPU backend's 128-token blocks)
    llama4 = [s for s, _ in SETTINGS if "llama4" in s.name]
    assert len(llama4) == 23
    assert all(s.groups[0] == ("chunked", 16, 32) for s in llama4 if not s.model)
    assert {s.model for s in llama4} == {"", "tiny-llama4"}
    assert {s.retention for s in llama4} == {None, 0}
    assert {s.num_spec for s, _ in SETTINGS} == {0, 2}
    assert any(s.num_spec and s.async_scheduling for s, _ in SETTINGS)
    assert {(s.aborts, s.async_scheduling) for s, _ in SETTINGS if s.aborts} == {
        (True, False),
        (True, True),
    }
    assert all(len(digests) >= 300 for _, digests in SETTINGS)
    # the streams exercise what they are meant to: prefix hits in every setting, and
    # preemptions in every layout, chunked or not, sync or async (not in every setting: a
    # no-chunk budget of max_model_len makes vLLM's smallest pool larger)
    assert all(
        TOTALS[s.name]["hit_tokens"] > 0 for s, _ in SETTINGS if s.enable_prefix_caching
    )
    for layout in ("dense", "swa", "v4", "llama4", "tiny-llama4"):
        for mode in ("-chunk-sync", "-chunk-async", "-nochunk-sync", "-nochunk-async"):
            assert any(
                t["preemptions"] > 0
                for n, t in TOTALS.items()
                if n.startswith(layout) and mode in n
            ), (layout, mode)
    # V4's smallest pools hold a whole prefill chunk's compressor states: preemptions are rare
    # there, and happen only when chunks are small
    for mode in ("-chunk-sync", "-chunk-async"):
        assert any(
            t["preemptions"] > 0
            for n, t in TOTALS.items()
            if n.startswith("dsv4") and mode in n
        ), mode


@pytest.mark.parametrize("setting,digests", SETTINGS, ids=[s.name for s, _ in SETTINGS])
def test_replays_vllm_first_streams(setting, digests):
    for seed, want in enumerate(digests[:3]):
        assert replay(setting, seed) == want, f"{setting.name} seed {seed}"


@pytest.mark.slow
def test_replays_vllm_every_stream():
    for setting, digests in SETTINGS:
        for seed, want in enumerate(digests):
            assert replay(setting, seed) == want, f"{setting.name} seed {seed}"


def mutant(old: str, new: str) -> type:
    """A copy of refimpl's `Scheduler` with `old` replaced by `new` in its source."""
    source = Path(scheduler_module.__file__).read_text()
    assert old in source, old
    module = types.ModuleType("mutant_scheduler")
    exec(compile(source.replace(old, new), "mutant_scheduler.py", "exec"), module.__dict__)
    return module.Scheduler


def async_mutant(scheduler_cls: type, old: str = "", new: str = "") -> type:
    """refimpl's `AsyncScheduler` on `scheduler_cls` (a mutant), with `old` replaced by
    `new` in its own source."""
    source = Path(async_scheduler_module.__file__).read_text()
    assert old in source, old
    imported = "from refimpl.sched.scheduler import Scheduler\n"
    assert imported in source
    module = types.ModuleType("mutant_async_scheduler")
    module.Scheduler = scheduler_cls
    code = (
        source.replace(imported, "").replace(old, new) if old else source.replace(imported, "")
    )
    exec(compile(code, "mutant_async_scheduler.py", "exec"), module.__dict__)
    return module.AsyncScheduler


MUTANTS = {
    # preempt the first running request instead of the last (FCFS)
    "preemption-order": (
        "preempted_req = self.running.pop()",
        "preempted_req = self.running.pop(0)",
    ),
    # ignore long_prefill_token_threshold
    "long-prefill-threshold": ("if 0 < threshold < num_new_tokens:", "if False:"),
    # do not pin the shared-prefix junction the lookup reports
    "junction-pin": ("request.shared_prefix_boundary = boundary", "pass"),
    # keep rejected draft tokens as computed
    "draft-rollback": ("request.num_computed_tokens -= num_rejected", "pass"),
    # an aborted request keeps its blocks
    "abort-free": (
        'request.finish_reason = "abort"\n            self._free_request(request)',
        'request.finish_reason = "abort"',
    ),
}
#: rules undone under async scheduling: (a MUTANTS key for the Scheduler underneath or None,
#: old, new in the AsyncScheduler's source, the settings replayed)
ASYNC_MUTANTS = {
    # async drafts: the placeholders scheduled as drafts are not counted as in flight
    "async-draft-placeholders": (
        None,
        "request.num_output_placeholders += len(spec_decode_tokens.get(rid, ()))",
        "pass",
        lambda s: s.num_spec > 0,
    ),
    # async aborts: an aborted request keeps its blocks
    "async-abort-free": ("abort-free", "", "", lambda s: s.aborts),
}


def _kills(cls: type | None, settings: list, name: str) -> None:
    """Fails unless `cls` (None: the scheduler as it is, over a patched cache) replays one of
    the first 40 streams of `settings` unlike vLLM."""
    checked = 0
    for setting, digests in settings:
        for seed, want in enumerate(digests[:40]):
            checked += 1
            try:
                if replay(setting, seed, cls) != want:
                    return
            except ValueError:
                return  # the mutant cannot even drive the cache through the stream
            except RuntimeError:
                return  # the stream never drains (a request waits forever)
    pytest.fail(f"mutant {name} replayed {checked} streams like vLLM")


@pytest.mark.parametrize("name", list(ASYNC_MUTANTS))
def test_async_replay_fails_with_a_rule_undone(name):
    base, old, new, chosen = ASYNC_MUTANTS[name]
    cls = async_mutant(
        scheduler_module.Scheduler if base is None else mutant(*MUTANTS[base]), old, new
    )
    _kills(cls, [(s, d) for s, d in SETTINGS if s.async_scheduling and chosen(s)], name)


@pytest.mark.parametrize("name", list(MUTANTS))
def test_replay_fails_with_a_rule_undone(name):
    cls = mutant(*MUTANTS[name])
    checked = 0
    for setting, digests in SETTINGS:
        if setting.async_scheduling:
            continue  # the mutant is the synchronous class
        if name == "abort-free" and not setting.aborts:
            continue
        if name == "long-prefill-threshold" and not setting.long_prefill_token_threshold:
            continue
        if name == "preemption-order" and setting.policy != "fcfs":
            continue
        if name == "junction-pin" and not setting.name.startswith(("swa", "v4", "dsv4")):
            continue
        if name == "draft-rollback" and not setting.num_spec:
            continue
        for seed, want in enumerate(digests[:40]):
            checked += 1
            try:
                if replay(setting, seed, cls) != want:
                    return
            except ValueError:
                return  # the mutant cannot even drive the cache through the stream
    pytest.fail(f"mutant {name} replayed {checked} streams like vLLM")


@pytest.mark.parametrize("rule", ["no skipped chunks", "hit from block 0"])
def test_llama4_replay_fails_with_a_chunked_local_rule_undone(monkeypatch, rule):
    """Each chunked local attention rule of the cache manager, undone, makes one of the first
    streams of the Llama 4 settings replay unlike vLLM.

    Two rules are caught by the allocator oracle only (tests/test_hybrid_vllm_oracle.py): the
    admission cap (a chunk plus the tokens in flight) is below every prompt these streams
    send, and the lookup order (full attention first) changes only the shared-prefix
    junction, which a step's output does not show and only a sliding window acts on."""
    from test_hybrid_vllm_oracle import undo_chunked_local_rule

    undo_chunked_local_rule(monkeypatch, rule)
    _kills(None, [(s, d) for s, d in SETTINGS if "llama4" in s.name], rule)


@pytest.mark.parametrize("name", ["junction-pin", "long-prefill-threshold"])
def test_deepseek_v4_replay_fails_with_a_rule_undone(name):
    """The real V4 caches (five groups, compressor states of 4 and 8 tokens) alone catch a
    rule undone."""
    chosen = [(s, d) for s, d in SETTINGS if s.model and not s.async_scheduling]
    if name == "long-prefill-threshold":
        chosen = [(s, d) for s, d in chosen if s.long_prefill_token_threshold]
    _kills(mutant(*MUTANTS[name]), chosen, name)
