"""Compile the Triton kernels for a CUDA GPU on this CPU-only machine.

The interpreter runs kernel bodies as numpy code, so it accepts things the GPU compiler
rejects (type mismatches in loop-carried values, ``tl.dot`` shapes) and it never runs out of
shared memory. Triton's wheel ships the NVIDIA backend with ``ptxas``, so the whole compile
(Triton IR -> LLVM -> PTX -> cubin) works without a GPU; only running the result needs one.
The compile runs in a fresh process with ``TRITON_INTERPRET=0``, because a process that
imported Triton in interpreter mode has interpreter versions of ``tl.sum``/``tl.max``.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

pytestmark = pytest.mark.slow  # compiles the kernels for a GPU target

pytest.importorskip("triton")

# the smallest per-block limit among sm_80 / sm_86 / sm_89 / sm_90
SHARED_MEMORY_LIMIT = 99 * 1024

COMPILE_ALL = r"""
import json, sys, torch
import refimpl.kernels
import triton
from triton.backends.compiler import GPUTarget
from triton.compiler import ASTSource

store = sys.modules["refimpl.kernels.store_kvcache"]
attention = sys.modules["refimpl.kernels.paged_attention"]
TYPES = {torch.float32: "fp32", torch.float16: "fp16", torch.bfloat16: "bf16"}

def compile_for_cuda(kernel, pointers, constexprs):
    signature = {}
    for name in kernel.arg_names:
        if name in pointers:
            signature[name] = pointers[name]
        elif name in constexprs:
            signature[name] = "constexpr"
        else:
            signature[name] = "fp32" if name == "scale_log2" else "i32"
    source = ASTSource(fn=kernel, signature=signature, constexprs=constexprs)
    return triton.compile(source, target=GPUTarget("cuda", 80, 32))

def attention_pointers(dtype, index_names):
    pointers = {name: "*" + TYPES[dtype] for name in ("q_ptr", "k_cache_ptr", "v_cache_ptr", "out_ptr")}
    pointers.update({name: "*i32" for name in index_names})
    pointers.update({name: "*fp32" for name in ("part_m_ptr", "part_l_ptr", "part_acc_ptr")})
    return pointers

report = {}
pointers = {n: "*bf16" for n in ("key_ptr", "value_ptr", "k_cache_ptr", "v_cache_ptr")}
pointers["slot_mapping_ptr"] = "*i64"
compiled = compile_for_cuda(store._store_kvcache_kernel, pointers, {"BLOCK_H": 8, "BLOCK_D": 128})
report["store bf16"] = compiled.metadata.shared

for dtype, head_dim, group, split in ((torch.bfloat16, 128, 4, True), (torch.float16, 128, 1, False),
                                      (torch.float32, 256, 64, True)):
    block_g, block_n, block_d = attention.decode_tiles(head_dim, group, dtype, interpret=False)
    compiled = compile_for_cuda(attention._paged_decode_kernel,
                                attention_pointers(dtype, ["cache_seqlens_ptr", "block_table_ptr"]),
                                {"BLOCK_G": block_g, "BLOCK_N": block_n, "BLOCK_D": block_d, "SPLIT": split,
                                 "DOT_IN_FP32": dtype == torch.float32})
    report[f"decode {TYPES[dtype]} d{head_dim} gqa{group}"] = compiled.metadata.shared
compiled = compile_for_cuda(attention._merge_decode_splits_kernel,
                            dict(attention_pointers(torch.bfloat16, ["cache_seqlens_ptr"]), out_ptr="*bf16"),
                            {"BLOCK_S": attention.MAX_SPLITS, "BLOCK_D": 256})
report["merge bf16 d256"] = compiled.metadata.shared

for dtype, head_dim in ((torch.bfloat16, 128), (torch.float32, 256)):
    block_m, block_n, block_d = attention.prefill_tiles(head_dim, dtype, interpret=False)
    compiled = compile_for_cuda(
        attention._paged_prefill_kernel,
        attention_pointers(dtype, ["cu_seqlens_q_ptr", "cu_seqlens_k_ptr", "block_table_ptr"]),
        {"BLOCK_M": block_m, "BLOCK_N": block_n, "BLOCK_D": block_d, "DOT_IN_FP32": dtype == torch.float32},
    )
    report[f"prefill {TYPES[dtype]} d{head_dim}"] = compiled.metadata.shared
print(json.dumps(report))
"""


def test_kernels_compile_for_sm80_within_shared_memory():
    """Every kernel compiles for sm_80, and the tiles the wrappers pick fit in shared
    memory."""
    env = dict(os.environ, TRITON_INTERPRET="0", TRITON_DEFAULT_FP_FUSION="1")
    done = subprocess.run(
        [sys.executable, "-c", COMPILE_ALL],
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    # pragma: no cover - wheels without the toolchain
    if "ptxas" in done.stderr and "not found" in done.stderr:
        pytest.skip("this Triton install has no ptxas to compile for NVIDIA GPUs")
    assert done.returncode == 0, done.stderr[-3000:]
    shared = json.loads(done.stdout.strip().splitlines()[-1])
    assert set(shared) == {
        "store bf16",
        "decode bf16 d128 gqa4",
        "decode fp16 d128 gqa1",
        "decode fp32 d256 gqa64",
        "merge bf16 d256",
        "prefill bf16 d128",
        "prefill fp32 d256",
    }
    assert all(0 <= size <= SHARED_MEMORY_LIMIT for size in shared.values()), shared


OFFSET_TYPES = r"""
import json, sys
import refimpl.kernels
import triton
from triton.backends.compiler import GPUTarget
from triton.compiler import ASTSource

store = sys.modules["refimpl.kernels.store_kvcache"]
attention = sys.modules["refimpl.kernels.paged_attention"]
DATA = ("key_ptr", "value_ptr", "q_ptr", "k_cache_ptr", "v_cache_ptr", "out_ptr")
kernels = {
    "store": (store._store_kvcache_kernel, {"BLOCK_H": 8, "BLOCK_D": 128}),
    "decode": (attention._paged_decode_kernel,
               {"BLOCK_G": 16, "BLOCK_N": 64, "BLOCK_D": 128, "SPLIT": True, "DOT_IN_FP32": False}),
    "prefill": (attention._paged_prefill_kernel, {"BLOCK_M": 64, "BLOCK_N": 32, "BLOCK_D": 128, "DOT_IN_FP32": False}),
}
report = {}
for name, (kernel, constexprs) in kernels.items():
    # Every index tensor and every stride is int32: any widening to int64 is the kernel's own doing.
    signature = {arg: ("*bf16" if arg in DATA else "*fp32" if arg.startswith("part_") else "*i32")
                 if arg.endswith("_ptr") else
                 "constexpr" if arg in constexprs else "fp32" if arg == "scale_log2" else "i32"
                 for arg in kernel.arg_names}
    compiled = triton.compile(ASTSource(fn=kernel, signature=signature, constexprs=constexprs),
                              target=GPUTarget("cuda", 80, 32))
    report[name] = [line.split(" loc(")[0].strip() for line in compiled.asm["ttir"].splitlines() if "tt.addptr" in line]
print(json.dumps(report))
"""


def test_cache_addresses_are_computed_in_int64():
    """``block_id * block_stride`` (and the token offset in store) must not overflow int32.

    A cache of more than 2**31 elements is common on a GPU and impossible in a CPU test, so
    this reads the compiled Triton IR instead: with int32 slot mappings, block tables and
    strides, the pointer offsets into the caches (and into key/value per token) are int64.
    """
    import re

    env = dict(os.environ, TRITON_INTERPRET="0", TRITON_DEFAULT_FP_FUSION="1")
    done = subprocess.run(
        [sys.executable, "-c", OFFSET_TYPES],
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    if "ptxas" in done.stderr and "not found" in done.stderr:  # pragma: no cover
        pytest.skip("this Triton install has no ptxas to compile for NVIDIA GPUs")
    assert done.returncode == 0, done.stderr[-3000:]
    addptr = json.loads(done.stdout.strip().splitlines()[-1])
    for base in ("k_cache_ptr", "v_cache_ptr", "key_ptr", "value_ptr"):
        assert any(
            re.search(rf"tt\.addptr %{base}, %\S+ : !tt\.ptr<bf16>, i64$", line)
            for line in addptr["store"]
        ), base
    for kernel in ("decode", "prefill"):
        for offset in ("k_off", "v_off"):
            assert any(
                re.search(
                    rf"%{offset}\S* : tensor<\d+x1x!tt\.ptr<bf16>>, tensor<\d+x1xi64>$", line
                )
                for line in addptr[kernel]
            ), (kernel, offset, addptr[kernel])
