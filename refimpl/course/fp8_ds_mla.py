"""DeepSeek V4's `fp8_ds_mla` page, packed and unpacked in plain torch (a teaching prop).

vLLM stores one 512-number DeepSeek V4 row (448 NoPE numbers, then 64 RoPE numbers) as 584
bytes: the NoPE part in fp8 (e4m3) with one UE8M0 scale per group of 64 values, the RoPE part
kept in bf16. A page of `n` rows holds every row's 576 data bytes first (448 fp8 + 128 bf16
bytes), then every row's 8 scale bytes (7 exponents and 1 zero pad byte), then the alignment
padding. This is the layout of `quantize_and_insert_k_cache` / `dequantize_and_gather_k_cache`
in vLLM's `vllm/models/deepseek_v4/common/ops/cache_utils.py`, written here in a few lines of
torch so a reader can count the bytes the spec's `real_page_size_bytes` promises.

UE8M0 ("unsigned, 8 exponent bits, 0 mantissa bits") stores only a power of two: the scale of a
group is `2 ** ceil(log2(amax / 448))` (448 is the largest e4m3 value), so the largest value of
the group lands at or just under 448 after division, and the byte kept is `exponent + 127`.
"""

from __future__ import annotations

import torch

from refimpl.hybrid.kv_cache_interface import DSV4_FP8_DS_MLA_TOKEN_BYTES, round_up
from refimpl.validation import check_positive_int

ROW_NUMBERS = 512  # DeepSeek V4's head_dim: one cached row per token (or compressed entry)
NOPE_NUMBERS = 448  # stored in fp8, one byte each
ROPE_NUMBERS = 64  # kept in bf16, two bytes each
QUANT_GROUP = 64  # NoPE values sharing one UE8M0 scale
SCALES_PER_ROW = 8  # 448 / 64 = 7 scales, plus 1 zero pad byte
DATA_BYTES = NOPE_NUMBERS + 2 * ROPE_NUMBERS  # 576: one row's values, scales excluded
FP8_MAX = 448.0  # largest float8_e4m3fn value
UE8M0_BIAS = 127
AMAX_FLOOR = 1e-4  # an all-zero group still gets a finite scale


def ue8m0_exponent(amax: torch.Tensor | float) -> torch.Tensor:
    """The power-of-two exponent of a group's scale: ceil(log2(max(amax, 1e-4) / 448))."""
    amax = torch.as_tensor(amax, dtype=torch.float32)
    return torch.ceil(torch.log2(amax.clamp(min=AMAX_FLOOR) / FP8_MAX)).to(torch.int32)


def ue8m0_byte(exponent: torch.Tensor) -> torch.Tensor:
    """The UE8M0 byte that stores `exponent` (biased by 127, clamped to 0..255)."""
    return (exponent + UE8M0_BIAS).clamp(0, 255).to(torch.uint8)


def ue8m0_scale(byte: torch.Tensor) -> torch.Tensor:
    """The scale a UE8M0 byte means: 2 ** (byte - 127)."""
    return torch.exp2(byte.to(torch.float32) - UE8M0_BIAS)


def _check_rows(rows: torch.Tensor) -> None:
    if not isinstance(rows, torch.Tensor):
        raise TypeError(f"rows must be a torch.Tensor, got {type(rows).__name__}")
    if rows.dim() != 2 or rows.shape[1] != ROW_NUMBERS or rows.shape[0] < 1:
        raise ValueError(
            f"rows must have shape (n, {ROW_NUMBERS}) with n >= 1, got {tuple(rows.shape)}"
        )
    if not rows.dtype.is_floating_point:
        raise ValueError(f"rows must be floating point, got {rows.dtype}")


def pack_fp8_ds_mla_page(rows: torch.Tensor, alignment: int | None = None) -> torch.Tensor:
    """The bytes (uint8, 1-d) of one page holding `rows` (n, 512), padded up to `alignment`.

    Layout: n x 576 data bytes (row i at i*576: 448 fp8 NoPE bytes, then 64 bf16 RoPE values),
    then n x 8 scale bytes (row i at n*576 + i*8), then zero padding up to a multiple of
    `alignment` (no padding when None).
    """
    _check_rows(rows)
    if alignment is not None:
        check_positive_int("alignment", alignment)
    n = rows.shape[0]
    rows = rows.float()
    groups = rows[:, :NOPE_NUMBERS].reshape(n, NOPE_NUMBERS // QUANT_GROUP, QUANT_GROUP)
    exponents = ue8m0_exponent(groups.abs().amax(dim=-1))  # (n, 7)
    scaled = (groups / torch.exp2(exponents.float())[..., None]).clamp(-FP8_MAX, FP8_MAX)
    nope = scaled.reshape(n, NOPE_NUMBERS).to(torch.float8_e4m3fn).view(torch.uint8)
    rope = rows[:, NOPE_NUMBERS:].to(torch.bfloat16).contiguous().view(torch.uint8)  # (n, 128)
    scales = torch.zeros(n, SCALES_PER_ROW, dtype=torch.uint8)
    scales[:, : NOPE_NUMBERS // QUANT_GROUP] = ue8m0_byte(exponents)
    real = n * DSV4_FP8_DS_MLA_TOKEN_BYTES
    page = torch.zeros(
        real if alignment is None else round_up(real, alignment), dtype=torch.uint8
    )
    page[: n * DATA_BYTES] = torch.cat([nope, rope], dim=1).flatten()
    page[n * DATA_BYTES : real] = scales.flatten()
    return page


def unpack_fp8_ds_mla_page(page: torch.Tensor, num_rows: int) -> torch.Tensor:
    """The rows (num_rows, 512) float32 that `pack_fp8_ds_mla_page` stored in `page`."""
    num_rows = check_positive_int("num_rows", num_rows)
    if not isinstance(page, torch.Tensor) or page.dtype != torch.uint8 or page.dim() != 1:
        raise ValueError("page must be a 1-d uint8 tensor (the bytes of one page)")
    if page.numel() < num_rows * DSV4_FP8_DS_MLA_TOKEN_BYTES:
        raise ValueError(
            f"a page of {page.numel()} bytes cannot hold {num_rows} rows of "
            f"{DSV4_FP8_DS_MLA_TOKEN_BYTES} bytes"
        )
    data = page[: num_rows * DATA_BYTES].view(num_rows, DATA_BYTES)
    scales = page[num_rows * DATA_BYTES : num_rows * DSV4_FP8_DS_MLA_TOKEN_BYTES].view(
        num_rows, SCALES_PER_ROW
    )
    nope = data[:, :NOPE_NUMBERS].contiguous().view(torch.float8_e4m3fn).float()
    scale = ue8m0_scale(scales[:, : NOPE_NUMBERS // QUANT_GROUP])  # (n, 7)
    nope = (nope.view(num_rows, -1, QUANT_GROUP) * scale[..., None]).reshape(
        num_rows, NOPE_NUMBERS
    )
    rope = data[:, NOPE_NUMBERS:].contiguous().view(torch.bfloat16).float()
    return torch.cat([nope, rope], dim=1)


def page_regions(num_rows: int, alignment: int | None = None) -> list[tuple[str, int, int]]:
    """(what, first byte, end byte) of every region of a page of `num_rows` rows, in byte
    order."""
    num_rows = check_positive_int("num_rows", num_rows)
    regions = []
    for i in range(num_rows):
        regions.append((f"row {i} NoPE (fp8)", i * DATA_BYTES, i * DATA_BYTES + NOPE_NUMBERS))
        regions.append(
            (f"row {i} RoPE (bf16)", i * DATA_BYTES + NOPE_NUMBERS, (i + 1) * DATA_BYTES)
        )
    start = num_rows * DATA_BYTES
    for i in range(num_rows):
        regions.append(
            (
                f"row {i} scales (UE8M0)",
                start + i * SCALES_PER_ROW,
                start + (i + 1) * SCALES_PER_ROW,
            )
        )
    real = num_rows * DSV4_FP8_DS_MLA_TOKEN_BYTES
    if alignment is not None:
        check_positive_int("alignment", alignment)
        if round_up(real, alignment) > real:
            regions.append(("padding", real, round_up(real, alignment)))
    return regions
