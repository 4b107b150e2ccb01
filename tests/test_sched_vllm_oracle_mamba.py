"""Each Mamba rule of refimpl's scheduler and cache is reached by vLLM 0.32's oracle.

`tests/test_sched_vllm_oracle.py` replays every recorded setting, the Mamba hybrids' among
them (`tools.crosscheck.sched_streams.mamba_settings`: tiny-granite-h, Mamba2 layers with a
prefill checkpoint block, and tiny-jamba, Mamba1 layers without; prefix caching on, vLLM's
"align" mode, at retention None, 0 and 512, and off, mode "none"). Here each Mamba rule is
undone in a copy of the scheduler's or the manager's source (a mutant), and the replay of the
recorded streams must then differ from vLLM's digest (or the cache refuses the stream).
"""

from __future__ import annotations

import types
from pathlib import Path

import pytest

import refimpl.hybrid.kv_cache_coordinator as coordinator_module
import refimpl.hybrid.single_type_kv_cache_manager as managers_module
from refimpl.hybrid.kv_cache_interface import MambaSpec, unwrap_spec
from tests.test_sched_vllm_oracle import SETTINGS, TOTALS, _kills, mutant
from tools.crosscheck.sched_streams import JAMBA_CONFIG, MAMBA_CONFIG

MAMBA = [(s, d) for s, d in SETTINGS if s.model == MAMBA_CONFIG]
JAMBA = [(s, d) for s, d in SETTINGS if s.model == JAMBA_CONFIG]
#: prefix caching on: granite first (its checkpoint block makes more rules act), then Jamba
ALIGN = [(s, d) for s, d in MAMBA + JAMBA if s.enable_prefix_caching]


def test_oracle_covers_the_mamba_hybrid():
    """Prefix caching on and off, every retention vLLM allows, chunked or not where vLLM
    allows it (align needs chunked prefill), sync and async, drafts and aborts; the streams
    hit the prefix cache and preempt in every mode."""
    names = {s.name for s, _ in MAMBA}
    assert len(names) == 16
    assert {s.retention for s, _ in ALIGN} == {None, 0, 512}
    assert all(s.enable_chunked_prefill for s, _ in ALIGN)
    for mode in ("chunk-sync", "chunk-async"):
        for retention in (None, 0, 512):
            assert f"mamba-ret{retention}-{mode}" in names
    for mode in ("chunk-sync", "chunk-async", "nochunk-sync", "nochunk-async"):
        assert f"mamba-nocache-{mode}" in names
    assert any(s.num_spec for s, _ in ALIGN) and any(s.aborts for s, _ in ALIGN)
    assert any(s.num_spec for s, _ in MAMBA if not s.enable_prefix_caching)
    assert all(len(d) >= 300 for _, d in MAMBA)
    assert all(TOTALS[s.name]["hit_tokens"] > 0 for s, _ in ALIGN)
    assert all(TOTALS[s.name]["preemptions"] > 0 for s, _ in MAMBA + JAMBA)
    jamba = {s.name for s, _ in JAMBA}
    assert jamba == {n.replace("mamba-", "jamba-") for n in names if n.count("-") == 3}


def manager_mutant(old: str, new: str, monkeypatch) -> None:
    """From now on (this test), Mamba groups get a `MambaManager` whose source has `old`
    replaced by `new`; the other groups keep refimpl's managers."""
    source = Path(managers_module.__file__).read_text()
    assert old in source, old
    module = types.ModuleType("mutant_single_type_kv_cache_manager")
    exec(compile(source.replace(old, new), "mutant_managers.py", "exec"), module.__dict__)
    original = coordinator_module.make_manager

    def make_manager(spec, block_pool, kv_cache_group_id, **kwargs):
        if isinstance(unwrap_spec(spec), MambaSpec):
            return module.MambaManager(spec, block_pool, kv_cache_group_id, **kwargs)
        return original(spec, block_pool, kv_cache_group_id, **kwargs)

    monkeypatch.setattr(coordinator_module, "make_manager", make_manager)


def _align(retention="any", spec=False) -> list:
    return [
        (s, d)
        for s, d in ALIGN
        if (retention == "any" or s.retention == retention) and bool(s.num_spec) == spec
    ]


#: rule undone in refimpl/sched/scheduler.py: (old, new, the settings replayed)
SCHEDULER_MUTANTS = {
    # no Mamba split at all: chunks end anywhere
    "aligned-split": (
        "        if start >= prefill_end:\n            return num_new_tokens\n",
        "        return num_new_tokens\n",
        ALIGN,
    ),
    # a chunk that stops before the prefill end is not cut back to a block boundary
    "split-block-floor": (
        "                end = aligned_end\n",
        "                pass\n",
        ALIGN,
    ),
    # the final chunk never exports its checkpoint mid-chunk: it stops at the last boundary
    "split-internal-checkpoint": (
        "        if use_internal_checkpoint:\n            last_cache_position = 0\n",
        "",
        ALIGN,
    ),
    # no stop at the shared-prefix junction the lookup reported
    "split-junction-stop": (
        "junction_stop if start < junction < end else 0,",
        "0,",
        ALIGN,
    ),
    # the step never tells the cache it begins: a state registered in an earlier step still
    # blocks hits on it
    "new-step-starts": ("        kvm.new_step_starts()\n", "", ALIGN),
}

#: rule undone in refimpl/hybrid/single_type_kv_cache_manager.py (MambaManager)
MANAGER_MUTANTS = {
    # a hit on a state registered in this same step is not refused
    "same-step-hit": (
        "            return self.block_pool.num_gpu_blocks + 1\n",
        "            pass\n",
        ALIGN,
    ),
    # the hit is the first cached state from the start, not the last
    "hit-last-state": (
        "        for i in range(min(max_length // bs, len(hashes)) - 1, -1, -1):\n",
        "        for i in range(min(max_length // bs, len(hashes))):\n",
        ALIGN,
    ),
    # retention ignored: every state is registered
    "retention-mask": (
        "        if retention_interval is None or alignment_tokens is None:\n",
        "        if True:\n",
        _align(0) + _align(512),
    ),
    # states before the running one are never retired
    "retire-states": (
        "        return [i for i in range(last - 1, first - 1, -1) if not table[i].is_null]",
        "        return []",
        ALIGN,
    ),
    # no checkpoint slot is reserved for the final chunk's mid-chunk state
    "checkpoint-slot": (
        "        return (\n            self.has_prefill_checkpoint_blocks\n",
        "        return False and (\n            self.has_prefill_checkpoint_blocks\n",
        ALIGN,
    ),
    # the state at the prompt's last boundary is not (re)keyed when the cache reaches it, so
    # a same-step hit on it is not refused
    "prompt-boundary-key": (
        "        if num_tokens != get_mamba_prefill_checkpoint_position(\n"
        "            request.num_prompt_tokens, self.hash_block_size\n        ):\n",
        "        if True:\n",
        ALIGN,
    ),
    # the null entries of a grown table are not sent with the new blocks
    "null-entries-sent": (
        "        returned = table[prev_len:] + new_blocks\n",
        "        returned = list(new_blocks)\n",
        ALIGN,
    ),
    # speculative slots left behind are not moved to the table's end
    "speculative-relocation": (
        "                moved.append(idx)\n",
        "                pass\n",
        _align(0, spec=True),
    ),
    # mode "none" keeps no speculative state blocks
    "none-speculative-blocks": (
        "num_tokens + self.block_size * self.num_speculative_blocks",
        "num_tokens",
        [(s, d) for s, d in MAMBA if s.num_spec and not s.enable_prefix_caching],
    ),
}


@pytest.mark.parametrize("name", list(SCHEDULER_MUTANTS))
def test_mamba_replay_fails_with_a_scheduler_rule_undone(name):
    old, new, settings = SCHEDULER_MUTANTS[name]
    _kills(mutant(old, new), [(s, d) for s, d in settings if not s.async_scheduling], name)


@pytest.mark.parametrize("name", ["aligned-split", "split-block-floor", "new-step-starts"])
def test_jamba_alone_fails_with_a_scheduler_rule_undone(name):
    """Mamba1 layers keep no checkpoint block: the Jamba settings alone catch the split."""
    old, new, _ = SCHEDULER_MUTANTS[name]
    jamba = [(s, d) for s, d in JAMBA if s.enable_prefix_caching and not s.async_scheduling]
    _kills(mutant(old, new), jamba, name)


@pytest.mark.parametrize("name", list(MANAGER_MUTANTS))
def test_mamba_replay_fails_with_a_manager_rule_undone(name, monkeypatch):
    old, new, settings = MANAGER_MUTANTS[name]
    manager_mutant(old, new, monkeypatch)
    _kills(None, settings, name)


def test_align_mode_refuses_what_vllm_refuses_or_refimpl_does_not_model():
    """vLLM asserts chunked prefill for "align"; lookahead slots (EAGLE/MTP) there are not
    modelled. Both are one-line ValueErrors from the scheduler's constructor."""
    from refimpl.hybrid.kv_cache_planning import get_kv_cache_config, get_kv_cache_groups
    from refimpl.sched import SchedulerConfig, make_scheduler
    from tools.crosscheck.sched_streams import LAYOUT, refimpl_specs

    setting = next(s for s, _ in ALIGN if not s.num_spec)
    config = get_kv_cache_config(
        get_kv_cache_groups(refimpl_specs(setting), kv_cache_layout=LAYOUT),
        1 << 40,
        num_blocks_override=setting.num_blocks,
        kv_cache_layout=LAYOUT,
    )
    base = dict(
        max_num_batched_tokens=512, max_num_seqs=4, max_model_len=setting.max_model_len
    )
    with pytest.raises(ValueError, match="enable_chunked_prefill=True"):
        make_scheduler(
            SchedulerConfig(
                **{**base, "max_num_batched_tokens": setting.max_model_len},
                enable_chunked_prefill=False,
            ),
            config,
        )
    with pytest.raises(ValueError, match="num_lookahead_tokens"):
        make_scheduler(SchedulerConfig(**base, num_lookahead_tokens=2), config)
    make_scheduler(SchedulerConfig(**base), config)  # the setting itself is accepted
