"""Bad input to the V4 engine: a clear ValueError before anything changes."""

from __future__ import annotations

import pytest

from refimpl.paged.sequence import SamplingParams
from tests.v4_models import hf_model, model_dir, prompts


def make_llm(**kwargs):
    from refimpl.v4.llm import V4LLM

    return V4LLM(model_dir("A"), hf_model=hf_model("A"), **kwargs)


def snapshot(llm):
    return (
        len(llm.scheduler.waiting),
        len(llm.scheduler.running),
        llm.scheduler.kv_cache_manager.usage,
        llm._next_id,
    )


@pytest.mark.parametrize(
    "prompts_, params, match",
    [
        ([[]], SamplingParams(max_tokens=2), "empty prompt"),
        ([[1, 2], list(range(100)) * 21], SamplingParams(max_tokens=2), "max_model_len"),
        ([[1, 2]], SamplingParams(max_tokens=2048), "max_model_len"),
        ([[1, 999]], SamplingParams(max_tokens=2), "vocabulary"),
        ([1, 2, 3], SamplingParams(max_tokens=2), "single prompt"),
        ([[1, 2]], [SamplingParams(), SamplingParams()], "SamplingParams"),
        ([[1, "x"]], SamplingParams(max_tokens=2), "token ids"),
    ],
)
def test_bad_prompts_change_nothing(prompts_, params, match):
    llm = make_llm(num_kvcache_blocks=64)
    before = snapshot(llm)
    with pytest.raises(ValueError, match=match):
        llm.generate(prompts_, params)
    assert snapshot(llm) == before


def test_pool_too_small_for_one_request():
    llm = make_llm(num_kvcache_blocks=12)
    before = snapshot(llm)
    with pytest.raises(ValueError, match="can grow to .* blocks .* the pool has only 11"):
        llm.generate([[5, 6], prompts()["P1"]], SamplingParams(max_tokens=2))
    assert snapshot(llm) == before
    out = llm.generate([[5, 6]], SamplingParams(temperature=0, max_tokens=2, ignore_eos=True))
    assert len(out[0]["token_ids"]) == 2  # still usable afterwards


@pytest.mark.parametrize(
    "kwargs",
    [
        dict(num_kvcache_blocks=1),
        dict(max_num_batched_tokens=0),
        dict(max_num_seqs=0),
        dict(max_model_len=10**6),
        dict(kvcache_block_size=100),
        dict(index_kernel_backend="fast"),
    ],
)
def test_bad_engine_arguments(kwargs):
    with pytest.raises(ValueError):
        make_llm(**kwargs)


# --- loading: like Part I's LLM, a local directory with safetensors weights and a V4 config
# only


def v4_copy(tmp_path, weights: bool = True):
    """A copy of tiny model A's directory (config, tokenizer; weights unless told
    otherwise)."""
    import shutil
    from pathlib import Path

    src = Path(model_dir("A"))
    for f in src.iterdir():
        if weights or not f.name.endswith(".safetensors"):
            shutil.copy(f, tmp_path / f.name)
    return tmp_path


def test_a_missing_directory_never_reaches_the_hub():
    import time

    from refimpl.v4.llm import V4LLM

    start = time.perf_counter()
    with pytest.raises(
        ValueError,
        match="must be a local checkpoint directory; 'missing-model-dir' is not one",
    ):
        V4LLM("missing-model-dir")
    assert time.perf_counter() - start < 1.0  # no download attempt, no retries


def test_a_model_that_is_not_a_path_is_a_type_error():
    from refimpl.v4.llm import V4LLM

    with pytest.raises(TypeError, match="model must be the path"):
        V4LLM(123)


def test_a_qwen3_checkpoint_gets_one_line(tmp_path):
    from refimpl.engine.tiny import make_tiny_model
    from refimpl.v4.llm import V4LLM

    path = make_tiny_model(tmp_path, seed=0)
    with pytest.raises(ValueError) as err:
        V4LLM(path)
    message = str(err.value)
    assert (
        "holds a 'qwen3' checkpoint; V4LLM runs only DeepSeek V4" in message
        and "\n" not in message
    )


def test_pickled_weights_are_refused_never_opened(tmp_path):
    from refimpl.v4.llm import V4LLM
    from refimpl.v4.loader import load_hf_model

    path = v4_copy(tmp_path, weights=False)
    (path / "pytorch_model.bin").write_bytes(
        b"not a pickle: opening it would fail differently"
    )
    for load in (V4LLM, load_hf_model):
        with pytest.raises(ValueError, match=r"only pickled weights \(pytorch_model.bin\)"):
            load(path)


@pytest.mark.parametrize(
    "config, match",
    [
        (None, "has no config.json"),
        ("{not json", "not valid JSON"),
        ('{"model_type": "deepseek_v3"}', "holds a 'deepseek_v3' checkpoint"),
    ],
)
def test_bad_config_files(tmp_path, config, match):
    from refimpl.v4.llm import V4LLM

    path = v4_copy(tmp_path)
    if config is None:
        (path / "config.json").unlink()
    else:
        (path / "config.json").write_text(config)
    with pytest.raises(ValueError, match=match):
        V4LLM(path, hf_model=hf_model("A"))


def test_enable_prefix_caching_must_be_a_bool():
    with pytest.raises(ValueError, match="enable_prefix_caching"):
        make_llm(enable_prefix_caching="no")


# --- close(): the cache goes back, and the engine refuses work afterwards


def test_close_releases_the_cache_and_refuses_work():
    import gc
    import weakref

    with make_llm(num_kvcache_blocks=64) as llm:
        out = llm.generate(
            [[5, 6]], SamplingParams(temperature=0, max_tokens=2, ignore_eos=True)
        )
        view = weakref.ref(next(iter(llm.model_runner.kv_cache.views.values())))
    assert len(out[0]["token_ids"]) == 2
    gc.collect()
    assert llm.closed and llm.model_runner.kv_cache is None and view() is None
    for call in (
        lambda: llm.generate([[5, 6]]),
        llm.step,
        lambda: llm.add_request([5], SamplingParams()),
    ):
        with pytest.raises(ValueError, match="closed"):
            call()


def test_two_engines_in_one_process():
    first, second = (
        make_llm(num_kvcache_blocks=64),
        make_llm(num_kvcache_blocks=32, max_num_batched_tokens=8, max_num_seqs=4),
    )
    sp = SamplingParams(temperature=0, max_tokens=3, ignore_eos=True)
    assert first.generate([prompts()["P2"]], sp) == second.generate([prompts()["P2"]], sp)
    first.close()
    assert len(second.generate([[1, 2, 3]], sp)[0]["token_ids"]) == 3
