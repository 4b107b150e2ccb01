"""vLLM's CPU platform, whose KV cache depends on the host's instruction set (vLLM 0.32).

vLLM's `CpuPlatform` asks torch two questions about the host and plans differently by the
answers (`vllm/platforms/cpu.py`):

- `torch.cpu._is_avx512_bf16_supported()`: its accelerated Mamba / gated-delta-net kernels
  keep the SSM state in float32, so an "auto" (or a Mamba2) state is reset to float32 ("Reset
  SSM cache type to float32"). A float32 state is twice as large, so a hybrid's attention
  blocks grow to hold it and fewer requests fit.
- `torch.cpu._is_amx_tile_supported()`: an MLA model runs the AMX MLA backend (any multiple
  of 32 tokens, 128-token blocks by default) instead of the reference CPU MLA kernel, which
  compiles for 16-token blocks only.

Which CPU to plan for is a `cpu_isa` name; "auto" (the default) reads the host as vLLM would.
Detection reads /proc/cpuinfo's flags (the same CPUID bits torch reports), so importing this
module costs nothing; only a host without /proc/cpuinfo asks torch, lazily.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from pathlib import Path

from refimpl.models.backends import AttentionBackendInfo
from refimpl.models.layers import Layer, MambaLayer


@dataclass(frozen=True)
class CpuIsa:
    """The answers vLLM's CPU platform gets from torch's probes for one kind of CPU."""

    name: str
    avx512_bf16: bool  # torch.cpu._is_avx512_bf16_supported()
    amx_tile: bool  # torch.cpu._is_amx_tile_supported() (AMX implies an x86 CPU)
    examples: str


#: The CPUs `cpu_isa` names; two of them plan alike (vLLM's probes see no difference).
CPU_ISAS = {
    isa.name: isa
    for isa in (
        CpuIsa("avx512_bf16_amx", True, True, "Intel Xeon Sapphire Rapids and later"),
        CpuIsa("avx512_bf16", True, False, "AMD Zen 4/5, Intel Cooper Lake"),
        CpuIsa("avx512", False, False, "Intel Skylake-SP to Ice Lake"),
        CpuIsa("avx2", False, False, "x86 without AVX-512; also plans Arm and POWER hosts"),
    )
}
AUTO = "auto"

#: vLLM's reference CPU MLA kernel (`CPUMLABackend`): 16-token blocks only, forced by the
#: platform whatever --block-size says.
CPU_MLA = AttentionBackendInfo("CPU_MLA", None, (16,), True, "cpu", kv_cache_dtypes=("auto",))
#: vLLM's AMX MLA backend (`AMXMLABackend`): any multiple of 32 tokens.
AMX_MLA = AttentionBackendInfo("AMX_MLA", 32, (), True, "cpu")
#: MLA backends a user may name on the CPU platform.
CPU_MLA_BACKENDS = {"cpu_mla": CPU_MLA, "amx_mla": AMX_MLA}


def cpu_isa_from_flags(flags: set[str]) -> CpuIsa:
    """The `CpuIsa` for a set of /proc/cpuinfo flags ("amx_tile", "avx512_bf16", ...)."""
    if "amx_tile" in flags and "avx512_bf16" in flags:
        return CPU_ISAS["avx512_bf16_amx"]
    if "avx512_bf16" in flags:
        return CPU_ISAS["avx512_bf16"]
    if "avx512f" in flags:
        return CPU_ISAS["avx512"]
    return CPU_ISAS["avx2"]


def detect_cpu_isa(cpuinfo: str | Path = "/proc/cpuinfo") -> CpuIsa:
    """This host's `CpuIsa`, as vLLM's probes would answer here."""
    path = Path(cpuinfo)
    if path.is_file():
        for line in path.read_text(errors="replace").splitlines():
            if line.startswith("flags"):
                return cpu_isa_from_flags(set(line.partition(":")[2].split()))
    import torch  # no /proc/cpuinfo (macOS, Windows): ask torch, as vLLM does

    probes = (torch.cpu._is_avx512_bf16_supported(), torch.cpu._is_amx_tile_supported())
    return next(
        (isa for isa in CPU_ISAS.values() if (isa.avx512_bf16, isa.amx_tile) == probes),
        CPU_ISAS["avx2"],
    )


def check_cpu_isa(cpu_isa: object) -> str:
    """`cpu_isa` if it is None, "auto" or a name in `CPU_ISAS`, else a one-line ValueError."""
    if cpu_isa is None:
        return AUTO
    if not isinstance(cpu_isa, str) or (cpu_isa != AUTO and cpu_isa not in CPU_ISAS):
        raise ValueError(
            f"cpu_isa must be one of {AUTO}, {', '.join(CPU_ISAS)}; got {cpu_isa!r:.60}"
        )
    return cpu_isa


def resolve_cpu_isa(cpu_isa: str | None) -> CpuIsa:
    """The CPU to plan for: the one named, or this host's for None / "auto"."""
    name = check_cpu_isa(cpu_isa)
    return detect_cpu_isa() if name == AUTO else CPU_ISAS[name]


def cpu_attention_backend(
    name: str, *, use_mla: bool, isa: CpuIsa
) -> tuple[AttentionBackendInfo, list[str]]:
    """The backend vLLM's `CpuPlatform.get_attn_backend_cls` picks, and why: CPU_ATTN for K/V
    attention; for MLA the AMX backend where the CPU has AMX tiles, unless CPU_MLA is named,
    else the reference CPU MLA kernel."""
    from refimpl.models.backends import BACKENDS

    key = name.lower()
    if not use_mla:
        if key in CPU_MLA_BACKENDS:
            raise ValueError(f"backend {name!r} serves MLA models only; use cpu_attn")
        return BACKENDS["cpu_attn"], []
    if isa.amx_tile and key != "cpu_mla":
        return AMX_MLA, [f"vLLM runs MLA on its AMX backend on a CPU with AMX ({isa.name})"]
    why = "CPU_MLA was named" if key == "cpu_mla" else f"a CPU without AMX ({isa.name})"
    return CPU_MLA, [f"vLLM runs its reference CPU MLA kernel ({why})"]


def mamba_ssm_cache_dtype(
    isa: CpuIsa, requested: str = "auto", *, keeps_requested: bool = False
) -> str:
    """The SSM state dtype vLLM's CPU platform settles on: on an AVX512-BF16 CPU its
    accelerated kernels reset anything but float32 to float32, except a float16/bfloat16
    state the gated-delta-net kernel takes as it is (`keeps_requested`: the model's
    `linear_attention` layers hold that dtype); elsewhere `requested` stands."""
    if not isa.avx512_bf16 or requested == "float32":
        return requested
    if requested in ("float16", "bfloat16") and keeps_requested:
        return requested
    return "float32"


def with_ssm_dtype(layers: list[Layer], dtype: str) -> list[Layer]:
    """The layers with each recurrent state's last tensor (the SSM or temporal state; vLLM's
    `_mamba_state_dtype`) stored as `dtype`; a conv-only state is left as it is."""
    out: list[Layer] = []
    for layer in layers:
        if isinstance(layer, MambaLayer) and len(layer.dtypes) >= 2:
            layer = replace(layer, dtypes=(*layer.dtypes[:-1], dtype))
        out.append(layer)
    return out
