"""Part III refuses what it could never run (issue 29): a request that could never fit the pool
is refused before it is queued, and the engine goes on serving the others; the engine's
switches do what their names say; a cut-short checkpoint gets one clear line. (The scheduler's
own contract, `refimpl.sched.Scheduler`, is tested in tests/test_sched*.py.)"""

from __future__ import annotations

import pytest
import torch

from refimpl.paged.sequence import SamplingParams
from tests.v4_models import hf_model, model_dir, prompts


def test_the_engine_refuses_a_request_it_cannot_hold_before_queueing():
    from refimpl.v4.llm import V4LLM

    llm = V4LLM(model_dir("A"), hf_model=hf_model("A"), num_kvcache_blocks=12)
    with pytest.raises(ValueError, match="but the pool has only 11; it could never run"):
        llm.add_request(prompts()["P1"], SamplingParams(max_tokens=2))
    assert llm.is_finished() and llm._next_id == 0
    assert llm.scheduler.get_num_unfinished_requests() == 0
    # a request that fits still runs to the end: the refused one never stalls the loop
    sp = SamplingParams(temperature=0, max_tokens=4, ignore_eos=True)
    assert len(llm.generate([[5, 6, 7]], sp)[0]["token_ids"]) == 4


# --- names and switches


def test_the_index_kernel_switch_is_named_for_what_it_switches():
    from refimpl.v4.llm import V4LLM

    with pytest.raises(TypeError, match="attention_backend"):
        V4LLM(model_dir("A"), hf_model=hf_model("A"), attention_backend="torch")
    llm = V4LLM(model_dir("A"), hf_model=hf_model("A"), index_kernel_backend="torch")
    assert llm.index_kernel_backend == "torch"
    assert not hasattr(llm, "attention_backend")


def test_the_cache_lives_where_it_is_asked_to():
    from refimpl.v4.cache import build_kv_cache

    kv = build_kv_cache(hf_model("A").config, 4, device="meta")
    assert kv.device == torch.device("meta")
    assert {v.device.type for v in kv.views.values()} == {"meta"}


def test_use_tqdm_shows_a_bar_or_is_refused(capsys):
    from refimpl.v4.llm import V4LLM

    llm = V4LLM(model_dir("A"), hf_model=hf_model("A"), num_kvcache_blocks=32)
    sp = SamplingParams(temperature=0, max_tokens=2, ignore_eos=True)
    quiet = llm.generate([[5, 6, 7]], sp)
    assert "Generating" not in capsys.readouterr().err
    shown = llm.generate([[5, 6, 7]], sp, use_tqdm=True)
    assert "Generating" in capsys.readouterr().err and shown == quiet
    with pytest.raises(TypeError, match="use_tqdm must be True or False"):
        llm.generate([[5, 6, 7]], sp, use_tqdm="yes")
    assert llm.is_finished()


# --- checkpoints


def test_a_truncated_checkpoint_gets_one_clear_line(tmp_path):
    import shutil
    from pathlib import Path

    from refimpl.v4.llm import V4LLM

    for f in Path(model_dir("A")).iterdir():
        shutil.copy(f, tmp_path / f.name)
    (weights,) = tmp_path.glob("*.safetensors")
    data = weights.read_bytes()
    weights.write_bytes(data[: len(data) - 100])
    with pytest.raises(ValueError, match=f"{weights.name} is truncated: it holds"):
        V4LLM(tmp_path)
    weights.write_bytes(data[:5])
    with pytest.raises(ValueError, match="too short for its header"):
        V4LLM(tmp_path)
