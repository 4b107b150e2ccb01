"""The fp8_ds_mla page packer of chapter 08b: vLLM's byte layout, UE8M0 scales, and sizes the
specs promise."""

from __future__ import annotations

import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st

from refimpl.course.fp8_ds_mla import (
    pack_fp8_ds_mla_page,
    page_regions,
    ue8m0_byte,
    ue8m0_exponent,
    ue8m0_scale,
    unpack_fp8_ds_mla_page,
)
from refimpl.hybrid import deepseek_v4


def rows(n: int, seed: int = 0, scale: float = 3.0) -> torch.Tensor:
    return scale * torch.randn(n, 512, generator=torch.Generator().manual_seed(seed))


# --- UE8M0


@pytest.mark.parametrize(
    ("amax", "exponent"),
    [(448.0, 0), (449.0, 1), (224.0, -1), (3.0, -7), (896.0, 1), (0.0, -22), (1e-4, -22)],
)
def test_ue8m0_exponent_is_the_smallest_power_of_two_that_fits_amax_under_448(amax, exponent):
    assert int(ue8m0_exponent(amax)) == exponent
    assert amax / 2.0**exponent <= 448.0
    if amax >= 1e-4:
        assert amax / 2.0 ** (exponent - 1) > 448.0  # one power of two less would overflow


def test_ue8m0_byte_is_the_biased_exponent_clamped_to_a_byte():
    assert ue8m0_byte(torch.tensor([0, -7, 128, 200, -127, -200])).tolist() == [
        127,
        120,
        255,
        255,
        0,
        0,
    ]
    assert ue8m0_scale(torch.tensor([127, 120, 130], dtype=torch.uint8)).tolist() == [
        1.0,
        2.0**-7,
        8.0,
    ]


# --- layout and sizes


@pytest.mark.parametrize("n", [1, 2, 64])
def test_page_has_584_bytes_per_row_and_pads_like_the_spec(n):
    assert pack_fp8_ds_mla_page(rows(n)).numel() == n * 584
    specs = deepseek_v4.kv_cache_specs("pro")
    by_entries = {
        spec.storage_block_size: spec
        for name, spec in specs.items()
        if name.endswith(("attn", "swa_cache"))
    }
    spec = by_entries.get(n)
    if spec is not None:  # 2 = a c128a page, 64 = a c4a or SWA page
        page = pack_fp8_ds_mla_page(rows(n), alignment=spec.alignment)
        assert page.numel() == spec.page_size_bytes
        assert spec.real_page_size_bytes == n * 584


def test_bytes_sit_where_vllms_kernel_puts_them():
    """Row i: 448 fp8 bytes at i*576, then its bf16 RoPE; scales after all data at n*576 + i*8;
    pad zero."""
    data = rows(3, seed=1)
    page = pack_fp8_ds_mla_page(data, alignment=576)
    assert page.numel() == 3 * 584 + (576 - 3 * 584 % 576)
    for i in range(3):
        rope = page[i * 576 + 448 : (i + 1) * 576]
        assert torch.equal(rope, data[i, 448:].to(torch.bfloat16).view(torch.uint8))
        scales = page[3 * 576 + i * 8 : 3 * 576 + (i + 1) * 8]
        amax = data[i, :448].reshape(7, 64).abs().amax(dim=1)
        assert scales[:7].tolist() == ue8m0_byte(ue8m0_exponent(amax)).tolist()
        assert int(scales[7]) == 0
        nope = page[i * 576 : i * 576 + 448].view(torch.float8_e4m3fn).float()
        expected = (data[i, :448].reshape(7, 64) / ue8m0_scale(scales[:7])[:, None]).reshape(
            448
        )
        assert torch.equal(nope, expected.to(torch.float8_e4m3fn).float())
    assert int(page[3 * 584 :].sum()) == 0  # alignment padding is zero


def test_page_regions_tile_the_page_in_byte_order():
    regions = page_regions(2, alignment=576)
    assert regions == [
        ("row 0 NoPE (fp8)", 0, 448),
        ("row 0 RoPE (bf16)", 448, 576),
        ("row 1 NoPE (fp8)", 576, 1024),
        ("row 1 RoPE (bf16)", 1024, 1152),
        ("row 0 scales (UE8M0)", 1152, 1160),
        ("row 1 scales (UE8M0)", 1160, 1168),
        ("padding", 1168, 1728),
    ]
    big = page_regions(64, alignment=576)
    assert all(a[2] == b[1] for a, b in zip(big, big[1:]))  # no gap, no overlap
    assert big[0][1] == 0 and big[-1] == ("padding", 37376, 37440)
    # no alignment: no padding
    assert page_regions(1)[-1] == ("row 0 scales (UE8M0)", 576, 584)


# --- round trip


@given(
    st.integers(1, 4), st.integers(0, 10_000), st.sampled_from([1e-3, 0.5, 3.0, 100.0, 5000.0])
)
def test_unpack_returns_rope_exactly_and_nope_within_fp8_rounding(n, seed, scale):
    data = rows(n, seed, scale)
    back = unpack_fp8_ds_mla_page(pack_fp8_ds_mla_page(data, alignment=576), n)
    assert back.shape == (n, 512)
    assert torch.equal(back[:, 448:], data[:, 448:].to(torch.bfloat16).float())
    groups, got = data[:, :448].reshape(n, 7, 64), back[:, :448].reshape(n, 7, 64)
    step = ue8m0_scale(ue8m0_byte(ue8m0_exponent(groups.abs().amax(dim=-1))))[..., None]
    # e4m3 keeps 3 mantissa bits (relative error <= 2**-4); below 2**-6 it is subnormal, in
    # steps of 2**-9
    bound = torch.maximum(groups.abs() * 2.0**-4, step * 2.0**-10)
    assert bool(((got - groups).abs() <= bound).all())


# --- errors


def test_bad_input_is_refused_with_a_message_naming_it():
    with pytest.raises(TypeError, match="rows must be a torch.Tensor"):
        pack_fp8_ds_mla_page([[0.0] * 512])
    with pytest.raises(ValueError, match=r"rows must have shape \(n, 512\)"):
        pack_fp8_ds_mla_page(torch.zeros(2, 511))
    with pytest.raises(ValueError, match=r"rows must have shape"):
        pack_fp8_ds_mla_page(torch.zeros(0, 512))
    with pytest.raises(ValueError, match="floating point"):
        pack_fp8_ds_mla_page(torch.zeros(1, 512, dtype=torch.int32))
    with pytest.raises(ValueError, match="alignment"):
        pack_fp8_ds_mla_page(rows(1), alignment=0)
    with pytest.raises(ValueError, match="cannot hold 2 rows"):
        unpack_fp8_ds_mla_page(pack_fp8_ds_mla_page(rows(1)), 2)
    with pytest.raises(ValueError, match="num_rows"):
        unpack_fp8_ds_mla_page(pack_fp8_ds_mla_page(rows(1)), 0)
    with pytest.raises(ValueError, match="1-d uint8"):
        unpack_fp8_ds_mla_page(torch.zeros(584), 1)
    with pytest.raises(ValueError, match="num_rows"):
        page_regions(0)
