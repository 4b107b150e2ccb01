"""Backend choice, the TRITON_INTERPRET rule, and flash-attn's block-size rule."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest
import torch

import refimpl.kernels  # noqa: F401  (loads the kernel modules into sys.modules)
from refimpl.kernels import backend, reference, torch_backend, triton_setup

PROBE = (
    "import json, os, refimpl, refimpl.kernels as k; from refimpl.kernels import triton_setup "
    "as s; "
    "print(json.dumps(dict(env=os.environ.get('TRITON_INTERPRET'), interpret=s.INTERPRET, "
    "by_user=s.INTERPRET_SET_BY_USER, has_triton=s.HAS_TRITON)))"
)


def probe(env_value: str | None) -> dict:
    """Import refimpl in a fresh interpreter with TRITON_INTERPRET unset or set to
    ``env_value``."""
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    if env_value is not None:
        env["TRITON_INTERPRET"] = env_value
    done = subprocess.run(
        [sys.executable, "-c", PROBE], env=env, capture_output=True, text=True, timeout=120
    )
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout.strip().splitlines()[-1])


@pytest.mark.slow  # a fresh interpreter
@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the CPU-only rule")
def test_without_cuda_refimpl_turns_the_interpreter_on():
    """A fresh interpreter where the user set nothing: refimpl sets TRITON_INTERPRET=1
    itself."""
    assert probe(None) == dict(env="1", interpret=True, by_user=False, has_triton=True)


@pytest.mark.slow  # a fresh interpreter
def test_a_users_own_setting_is_left_alone():
    """A fresh interpreter where the user chose compiled mode: refimpl keeps that choice."""
    assert probe("0") == dict(env="0", interpret=False, by_user=True, has_triton=True)


def test_compiled_mode_on_cpu_tensors_is_a_clear_error(monkeypatch):
    module = sys.modules["refimpl.kernels.store_kvcache"]
    monkeypatch.setattr(sys.modules["refimpl.kernels.common"], "INTERPRET", False)
    rows = torch.ones(1, 1, 8)
    with pytest.raises(ValueError, match="TRITON_INTERPRET"):
        module.store_kvcache(
            rows, rows, torch.zeros(1, 2, 1, 8), torch.zeros(1, 2, 1, 8), torch.tensor([0])
        )


def test_missing_triton_is_reported_when_a_kernel_is_called(monkeypatch):
    module = sys.modules["refimpl.kernels.store_kvcache"]
    monkeypatch.setattr(sys.modules["refimpl.kernels.common"], "HAS_TRITON", False)
    rows = torch.ones(1, 1, 8)
    with pytest.raises(backend.BackendUnavailableError, match="reference"):
        module.store_kvcache(
            rows, rows, torch.zeros(1, 2, 1, 8), torch.zeros(1, 2, 1, 8), torch.tensor([0])
        )


@pytest.mark.parametrize("interpret", [True, False], ids=["interpreter", "compiled"])
def test_cpu_backends_and_best_choice(monkeypatch, interpret):
    """On CPU tensors: Triton only in interpreter mode (a CPU-only machine), never in compiled
    mode (a GPU machine, where Triton compiles for CUDA); torch is the automatic choice either
    way."""
    monkeypatch.setattr(backend, "INTERPRET", interpret)
    assert backend.available_attention_backends("cpu") == (
        ["triton", "torch"] if interpret else ["torch"]
    )
    # the interpreter is never picked by itself
    assert backend.best_attention_backend("cpu") == "torch"
    assert backend.check_attention_backend("auto", "cpu", 16) == "torch"
    if interpret:
        assert backend.check_attention_backend("triton", "cpu", 7) == "triton"
    else:
        with pytest.raises(backend.BackendUnavailableError, match="TRITON_INTERPRET=1"):
            backend.check_attention_backend("triton", "cpu", 7)


def test_flash_attn_needs_cuda_and_the_package():
    with pytest.raises(backend.BackendUnavailableError, match="only on CUDA"):
        backend.check_attention_backend("flash-attn", "cpu", 256)
    if torch.cuda.is_available() and not backend.has_flash_attn():
        with pytest.raises(backend.BackendUnavailableError, match="not installed"):
            backend.check_attention_backend("flash-attn", "cuda", 256)


@pytest.mark.parametrize("device", ["cpu", "cuda"])
def test_flash_attn_block_size_rule_is_reported_on_any_machine(device):
    """A block size flash-attn cannot page is a ValueError, whether or not flash-attn could run
    here."""
    with pytest.raises(ValueError, match="multiple of 256"):
        backend.check_attention_backend("flash-attn", device, 16)


def test_best_backend_on_cuda_follows_installed_packages(monkeypatch):
    monkeypatch.setattr(backend, "has_flash_attn", lambda: True)
    assert backend.available_attention_backends("cuda") == ["flash-attn", "triton", "torch"]
    assert backend.best_attention_backend("cuda", block_size=256) == "flash-attn"
    # flash-attn cannot page 16
    assert backend.best_attention_backend("cuda", block_size=16) == "triton"
    monkeypatch.setattr(backend, "has_flash_attn", lambda: False)
    assert backend.best_attention_backend("cuda") == "triton"


@pytest.mark.parametrize("block_size", [256, 512, 1024])
def test_flash_attn_block_sizes_that_work(block_size):
    backend.check_flash_attn_block_size(block_size)


@pytest.mark.parametrize(
    "block_size,suggestion", [(16, 256), (128, 256), (300, 512), (0, 256), (-4, 256)]
)
def test_flash_attn_block_sizes_that_do_not(block_size, suggestion):
    with pytest.raises(ValueError) as info:
        backend.check_flash_attn_block_size(block_size)
    assert "multiple of 256" in str(info.value)
    assert f"kvcache_block_size={suggestion}" in str(info.value)


def test_unknown_backend_name():
    with pytest.raises(ValueError, match="choose one of flash-attn, triton, torch"):
        backend.check_attention_backend("cuda-graphs", "cpu")


def test_attention_ops_bundle_the_three_functions(kernel_device):
    # The torch backend runs the fast versions of the twins
    # (tests/test_kernels_torch_backend.py holds them to the twins) and lets the engine check a
    # step's arguments once.
    ops = backend.attention_ops("torch", "cpu")
    assert (
        ops.name,
        ops.store_kvcache,
        ops.paged_decode_attention,
        ops.paged_prefill_attention,
    ) == (
        "torch",
        torch_backend.store_kvcache,
        torch_backend.paged_decode_attention,
        torch_backend.paged_prefill_attention,
    )
    assert ops.check_once_per_step
    import refimpl.kernels as kernels

    ops = backend.attention_ops("triton", kernel_device, block_size=3)
    assert ops.paged_prefill_attention is kernels.paged_prefill_attention
    assert not ops.check_once_per_step  # the kernels check every call


def test_v4_index_ops_pick_the_twins_or_the_kernels():
    from refimpl.kernels import deepseek_v4, reference_v4

    ops = backend.v4_index_ops(None, "cpu")  # the interpreter is never picked by itself
    assert (
        ops.name,
        ops.compute_swa_indices_and_lens,
        ops.compute_global_topk_indices_and_lens,
    ) == (
        "torch",
        reference_v4.compute_swa_indices_and_lens,
        reference_v4.compute_global_topk_indices_and_lens,
    )
    ops = backend.v4_index_ops("triton", "cpu")
    assert (ops.name, ops.compute_swa_indices_and_lens) == (
        "triton",
        deepseek_v4.compute_swa_indices_and_lens,
    )
    assert ops.compressed_slot_mapping is reference_v4.compressed_slot_mapping  # torch in both
    with pytest.raises(ValueError, match="flash-attn has no DeepSeek V4 index kernels"):
        backend.v4_index_ops("flash-attn", "cuda")


def test_v4_index_ops_on_cuda_with_flash_attn_fall_back_to_triton(monkeypatch):
    monkeypatch.setattr(backend, "has_flash_attn", lambda: True)
    monkeypatch.setattr(backend, "MODE_MISMATCH", None)
    assert backend.v4_index_ops("auto", "cuda").name == (
        "triton" if backend.HAS_TRITON else "torch"
    )


def test_setup_flags_agree_with_triton():
    import triton

    assert triton_setup.HAS_TRITON
    assert triton_setup.INTERPRET == bool(triton.knobs.runtime.interpret)
    # the usual case: refimpl made the choice in this process
    if not triton_setup.INTERPRET_SET_BY_USER:
        assert triton_setup.INTERPRET == (not torch.cuda.is_available())
        assert os.environ.get("TRITON_INTERPRET") == ("1" if triton_setup.INTERPRET else None)


def test_mode_mismatch_is_detected_and_reported(monkeypatch):
    """Triton imported in one mode, kernels defined in the other: a clear error, not a crash
    inside Triton."""
    assert triton_setup.MODE_MISMATCH is None  # this process is consistent
    monkeypatch.setattr(triton_setup, "INTERPRET", not triton_setup.INTERPRET)
    reason = triton_setup._mode_mismatch()
    assert reason is not None and "Import refimpl before triton" in reason
    module = sys.modules["refimpl.kernels.store_kvcache"]
    monkeypatch.setattr(sys.modules["refimpl.kernels.common"], "MODE_MISMATCH", reason)
    rows = torch.ones(1, 1, 8)
    with pytest.raises(backend.BackendUnavailableError, match="different modes"):
        module.store_kvcache(
            rows, rows, torch.zeros(1, 2, 1, 8), torch.zeros(1, 2, 1, 8), torch.tensor([0])
        )
    # the DeepSeek V4 index kernels run the same device check (they used to skip the mode
    # check)
    v4 = sys.modules["refimpl.kernels.deepseek_v4"]
    index = torch.zeros(1, dtype=torch.int32)
    with pytest.raises(backend.BackendUnavailableError, match="different modes"):
        v4.compute_swa_indices_and_lens(
            torch.tensor([0, 1], dtype=torch.int32),
            index + 1,
            index,
            torch.ones(1, dtype=torch.bool),
            torch.zeros(1, 1, dtype=torch.int32),
            4,
            2,
        )


NO_TRITON = r"""
import json, sys
sys.modules["triton"] = None  # what a machine without Triton looks like: `import triton` fails
import torch
import refimpl, refimpl.engine, refimpl.kernels as k
from refimpl.kernels import backend, reference, torch_backend, triton_setup
cache = torch.zeros(2, 4, 1, 8)
rows = torch.ones(1, 1, 8)
reference.store_kvcache(rows, rows, cache, cache.clone(), torch.tensor([5]))
try:
    k.store_kvcache(rows, rows, cache, cache.clone(), torch.tensor([5]))
    error = None
except backend.BackendUnavailableError as e:
    error = str(e)
try:
    backend.check_attention_backend("triton", "cpu", 4)
    choice_error = None
except backend.BackendUnavailableError as e:
    choice_error = str(e)
print(json.dumps(dict(has_triton=triton_setup.HAS_TRITON, backends=backend.available_attention_backends("cpu"),
                      twin_wrote=bool(cache[1, 1].eq(1).all()), error=error, choice_error=choice_error)))
"""


@pytest.mark.slow  # a fresh interpreter
def test_importing_refimpl_without_triton_works_and_kernels_say_what_is_missing():
    done = subprocess.run(
        [sys.executable, "-c", NO_TRITON], capture_output=True, text=True, timeout=120
    )
    assert done.returncode == 0, done.stderr
    report = json.loads(done.stdout.strip().splitlines()[-1])
    assert (
        report["has_triton"] is False
        and report["backends"] == ["torch"]
        and report["twin_wrote"]
    )
    assert (
        "Triton is not installed" in report["error"]
        and "Triton is not installed" in report["choice_error"]
    )


def _fake_flash_attn_module(calls: list):
    """A stand-in for the CUDA-only ``flash_attn`` package with its real signatures, computing
    with the torch twins, so the wrapper's plumbing (shapes, index dtypes, keywords) runs on a
    CPU."""
    import types

    def flash_attn_with_kvcache(
        q,
        k_cache,
        v_cache,
        k=None,
        v=None,
        rotary_cos=None,
        rotary_sin=None,
        cache_seqlens=None,
        cache_batch_idx=None,
        cache_leftpad=None,
        block_table=None,
        softmax_scale=None,
        causal=False,
        window_size=(-1, -1),
        softcap=0.0,
        rotary_interleaved=True,
        alibi_slopes=None,
        num_splits=0,
        return_softmax_lse=False,
    ):
        assert q.dim() == 4 and q.shape[1] == 1, "q is [batch, seqlen_q, heads, head_dim]"
        assert k is None and v is None, "the new K/V is already stored; nothing to append"
        assert cache_seqlens.dtype == block_table.dtype == torch.int32 and causal
        calls.append("decode")
        return reference.paged_decode_attention(
            q[:, 0], k_cache, v_cache, cache_seqlens, block_table, softmax_scale
        ).unsqueeze(1)

    def flash_attn_varlen_func(
        q,
        k,
        v,
        cu_seqlens_q,
        cu_seqlens_k,
        max_seqlen_q,
        max_seqlen_k,
        dropout_p=0.0,
        softmax_scale=None,
        causal=False,
        window_size=(-1, -1),
        softcap=0.0,
        alibi_slopes=None,
        deterministic=False,
        return_attn_probs=False,
        block_table=None,
    ):
        assert (
            cu_seqlens_q.dtype == cu_seqlens_k.dtype == block_table.dtype == torch.int32
            and causal
        )
        assert dropout_p == 0.0
        calls.append("prefill")
        return reference.paged_prefill_attention(
            q,
            k,
            v,
            cu_seqlens_q,
            cu_seqlens_k,
            max_seqlen_q,
            max_seqlen_k,
            block_table,
            softmax_scale,
        )

    return types.SimpleNamespace(
        flash_attn_with_kvcache=flash_attn_with_kvcache,
        flash_attn_varlen_func=flash_attn_varlen_func,
    )


def test_flash_attn_wrapper_passes_paged_arguments_the_way_flash_attn_takes_them(monkeypatch):
    calls: list[str] = []
    monkeypatch.setitem(sys.modules, "flash_attn", _fake_flash_attn_module(calls))
    ops = backend._flash_attn_ops()
    gen = torch.Generator().manual_seed(3)
    k_cache, v_cache = torch.randn(2, 4, 256, 2, 8, generator=gen)  # 4 blocks of 256 tokens
    # int64: the wrapper converts
    block_table = torch.tensor([[2, 0], [1, -1]], dtype=torch.int64)
    seqlens = torch.tensor([300, 5], dtype=torch.int64)
    q = torch.randn(2, 4, 8, generator=gen)
    got = ops.paged_decode_attention(
        q, k_cache, v_cache, seqlens, block_table, softmax_scale=0.3
    )
    torch.testing.assert_close(
        got, reference.paged_decode_attention(q, k_cache, v_cache, seqlens, block_table, 0.3)
    )
    cu_q, cu_k = torch.tensor([0, 3, 5]), torch.tensor([0, 300, 305])
    qp = torch.randn(5, 4, 8, generator=gen)
    got = ops.paged_prefill_attention(qp, k_cache, v_cache, cu_q, cu_k, 3, 300, block_table)
    want = reference.paged_prefill_attention(
        qp, k_cache, v_cache, cu_q, cu_k, 3, 300, block_table
    )
    torch.testing.assert_close(got, want)
    assert calls == ["decode", "prefill"]
    # pages of 16: flash-attn would refuse them, so the wrapper does first
    small = torch.zeros(4, 16, 2, 8)
    with pytest.raises(ValueError, match="multiple of 256"):
        ops.paged_decode_attention(q, small, small, torch.tensor([3, 3]), block_table)
