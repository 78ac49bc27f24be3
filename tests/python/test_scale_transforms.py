"""The scale-transform references (fp8quant.reference: convert_scales, pack_ue8m0,
unpack_ue8m0, sm100_weight_scales, requantize_ue8m0), against values written out by hand and
against the quantizers' own outputs; the oracles the pack kernels will be tested against."""

from __future__ import annotations

import math

import pytest
import torch
from handmath import e4m3_byte, f32_round, full_buffer

import fp8quant
from fp8quant import reference as R

FP8 = torch.float8_e4m3fn


def in_layout(values: torch.Tensor, layout: str) -> torch.Tensor:
    """fp32 [M, G] values placed in a layout's whole buffer (padding rows 0)."""
    spec = fp8quant.scale_spec(layout, values.shape[-2], values.shape[-1], tuple(values.shape[:-2]))
    out = torch.zeros(spec.numel).as_strided(spec.shape, spec.stride)
    return out.copy_(values)


def pow2_scales(shape, seed=0) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    return 2.0 ** torch.randint(-40, 40, shape, generator=g).float()


# --- convert_scales ------------------------------------------------------------------------------


@pytest.mark.parametrize("src", ["row", "mn", "mn_tma"])
@pytest.mark.parametrize("dst", ["row", "mn", "mn_tma"])
def test_convert_scales(src, dst):
    values = torch.arange(1, 16, dtype=torch.float32).view(5, 3)  # M = 5, G = 3
    out = R.convert_scales(in_layout(values, src), src, dst)
    spec = fp8quant.scale_spec(dst, 5, 3)
    assert out.stride() == spec.stride and torch.equal(out, values)
    buf = full_buffer(out)[: spec.numel]
    if dst == "mn_tma":  # columns of align(5, 4) = 8 rows: 1, 4, 7, 10, 13, 0, 0, 0, then 2, 5, ...
        assert buf.tolist() == [1, 4, 7, 10, 13, 0, 0, 0, 2, 5, 8, 11, 14, 0, 0, 0, 3, 6, 9, 12, 15, 0, 0, 0]
    elif dst == "row":
        assert buf.tolist() == list(range(1, 16))


def test_convert_scales_batched_and_errors():
    values = torch.rand(2, 5, 3)
    out = R.convert_scales(in_layout(values, "row"), "row", "mn_tma")
    assert out.stride() == (24, 1, 8) and torch.equal(out, values)
    with pytest.raises(ValueError, match=r"^to_layout must be one of"):
        R.convert_scales(values[0].contiguous(), "row", "packed_ue8m0")
    with pytest.raises(ValueError, match=r"^scale must have shape \(5, 3\) and strides \(1, 8\) for layout 'mn_tma'"):
        R.convert_scales(values[0].contiguous(), "mn_tma", "row")


# --- pack_ue8m0 / unpack_ue8m0 ------------------------------------------------------------------


def test_pack_by_hand():
    """Row 0: 2^-3, 1, 2, 2^127, 2^-127 (subnormal): bytes 124, 127, 128, 254, 0 in two words."""
    values = torch.tensor([[2.0**-3, 1.0, 2.0, 2.0**127, 2.0**-127], [1.0] * 5], dtype=torch.float32)
    packed = R.pack_ue8m0(in_layout(values, "row"), "row")
    assert packed.shape == (2, 2) and packed.stride() == (1, 4) and packed.dtype == torch.int32
    words = (full_buffer(packed).to(torch.int64) & 0xFFFFFFFF).tolist()
    # word (m, p) at p * 4 + m; rows 2, 3 are padding
    assert words == [124 | 127 << 8 | 128 << 16 | 254 << 24, 0x7F7F7F7F, 0, 0, 0, 127, 0, 0]


@pytest.mark.parametrize("bad", [3.0, 0.0, -1.0, math.inf, math.nan, 2.0**-128, 1.5])
def test_pack_refuses_non_ue8m0_values(bad):
    values = torch.ones(2, 3)
    values[1, 2] = bad
    with pytest.raises(ValueError, match=r"^scale\[1, 2\] = .* is not a power of two in \[2\^-127, 2\^127\]"):
        R.pack_ue8m0(values, "row")


@pytest.mark.parametrize("layout", ["row", "mn", "mn_tma"])
@pytest.mark.parametrize("g", [1, 4, 7])
def test_unpack_inverts_pack(layout, g):
    values = pow2_scales((3, 5, g), seed=g)
    values[0, 0, 0] = 2.0**-127
    packed = R.pack_ue8m0(in_layout(values, layout), layout)
    back = R.unpack_ue8m0(packed, g, layout)
    assert torch.equal(back, values) and torch.equal(
        full_buffer(back)[: back.untyped_storage().nbytes() // 4], full_buffer(in_layout(values, layout))
    )


def test_unpack_errors():
    packed = R.pack_ue8m0(torch.ones(4, 5), "row")
    with pytest.raises(ValueError, match=r"^packed has 2 words a row; 9 groups need 3"):
        R.unpack_ue8m0(packed, 9)
    nan = packed.clone()
    full_buffer(nan)[0] = 0xFF
    with pytest.raises(ValueError, match="NaN byte"):
        R.unpack_ue8m0(nan, 5)
    # the packed argument is named packed, not scale
    with pytest.raises(TypeError, match=r"^packed must be torch.int32 for layout 'packed_ue8m0', got torch.float32$"):
        R.unpack_ue8m0(packed.float(), 5)
    with pytest.raises(ValueError, match=r"^packed must have shape \(4, 2\) and strides \(1, 4\)"):
        R.unpack_ue8m0(packed.contiguous(), 5)


@pytest.mark.parametrize("m, k", [(5, 640), (1, 128), (130, 7168)])
def test_pack_of_the_quantizers_scales_is_its_packed_output(m, k):
    """pack_ue8m0 of per_token_group_quant's UE8M0 fp32 scales is, byte for byte and padding
    included, what the quantizer writes as packed_ue8m0 (both paths of SPEC 2 agree)."""
    x = (torch.randn(m, k, generator=torch.Generator().manual_seed(m)) * 10).to(torch.bfloat16)
    _, fp32 = R.per_token_group_quant(x, 128, scale_layout="mn_tma", ue8m0=True)
    _, packed = R.per_token_group_quant(x, 128, scale_layout="packed_ue8m0")
    assert torch.equal(full_buffer(R.pack_ue8m0(fp32, "mn_tma")), full_buffer(packed))
    assert torch.equal(R.unpack_ue8m0(packed, k // 128, "mn_tma"), fp32)


# --- sm100_weight_scales ----------------------------------------------------------------------------


def test_sm100_weight_scales_by_hand():
    """N = 5 rows in blocks of 2 (blocks 0, 0, 1, 1, 2), kb = 5 column blocks: row n takes block
    n // 2's five scales, packed into two words a row; rows padded to 8."""
    block = torch.tensor([[1.0, 2.0, 4.0, 8.0, 16.0], [0.5, 0.25, 1.0, 1.0, 1.0], [2.0**-10] * 5])
    out = R.sm100_weight_scales(block, 5, block_n=2)
    assert out.shape == (5, 2) and out.stride() == (1, 8)
    words = (full_buffer(out).to(torch.int64) & 0xFFFFFFFF).tolist()
    row0 = 127 | 128 << 8 | 129 << 16 | 130 << 24
    row2 = 126 | 125 << 8 | 127 << 16 | 127 << 24
    row4 = 117 * 0x01010101
    assert words[:8] == [row0, row0, row2, row2, row4, 0, 0, 0]
    assert words[8:] == [131, 131, 127, 127, 117, 0, 0, 0]


def test_sm100_weight_scales_of_a_quantized_weight():
    w = (torch.randn(300, 520, generator=torch.Generator().manual_seed(1))).to(torch.bfloat16)
    _, s = fp8quant.per_block_quant(w, ue8m0=True)
    out = R.sm100_weight_scales(s, 300)
    assert out.shape == (300, 2) and out.stride() == (1, 300)
    back = R.unpack_ue8m0(out, 5, "row")
    assert torch.equal(back, s.repeat_interleave(128, 0)[:300])
    with pytest.raises(ValueError, match=r"^n must be an int with ceil\(n / block_n\) == 3"):
        R.sm100_weight_scales(s, 400)


# --- requantize_ue8m0 -----------------------------------------------------------------------------


def test_requantize_by_hand():
    """Block scale 1.5, largest element 448: dequantized 672, new scale 672 / 448 = 1.5 rounded up
    to 2; 672 / 2 = 336, a tie between e4m3's 320 and 352: 320; 1.5 / 2 = 0.75; -4.5 / 2 = -2.25."""
    q = torch.zeros(2, 3, dtype=FP8)
    q[0, 0], q[0, 1], q[1, 2] = 448.0, 1.0, -3.0
    q2, s2 = R.requantize_ue8m0(q, torch.tensor([[1.5]]), (2, 3))
    assert s2.tolist() == [[2.0]]
    want = [e4m3_byte(f32_round(v * 0.75)) for v in (448.0, 1.0, 0.0, 0.0, 0.0, -3.0)]
    assert q2.view(torch.uint8).flatten().tolist() == want
    assert q2.float()[0, 0].item() == 320.0


def test_requantize_keeps_power_of_two_blocks_and_nan():
    """Blocks with power-of-two scales keep their values exactly (q' * s' == q * s): the scale
    stays, or halves where the block's largest element rounded down to 224 * 2^j. NaN stays NaN."""
    w = torch.randn(260, 300, generator=torch.Generator().manual_seed(2)).to(torch.bfloat16)
    q, s = fp8quant.per_block_quant(w, ue8m0=True)
    q.view(torch.uint8)[3, 4] = 0x7F  # NaN
    q2, s2 = R.requantize_ue8m0(q, s)

    def values(q, s):
        return q.float() * s.repeat_interleave(128, 0)[:260].repeat_interleave(128, 1)[:, :300]

    assert bool(((s2 == s) | (s2 == s / 2)).all())
    torch.testing.assert_close(values(q2, s2), values(q, s), rtol=0, atol=0, equal_nan=True)
    assert q2.view(torch.uint8)[3, 4] == 0x7F


def test_requantize_stays_close_to_the_weight():
    w = torch.randn(260, 300, generator=torch.Generator().manual_seed(3)).to(torch.bfloat16)
    q, s = fp8quant.per_block_quant(w)
    q2, s2 = R.requantize_ue8m0(q, s)
    deq = q2.float() * s2.repeat_interleave(128, 0)[:260].repeat_interleave(128, 1)[:, :300]
    assert ((deq - w.float()).norm() / w.float().norm()).item() < 0.08
    with pytest.raises(ValueError, match=r"^scale must be float32 of shape \(3, 3\)"):
        R.requantize_ue8m0(q, s[:2])


def test_requantize_is_dequantize_then_quantize():
    """The same as quantizing the bf16 dequantized weight with UE8M0 scales (partial blocks, 3-D)."""
    w = (torch.randn(2, 200, 300, generator=torch.Generator().manual_seed(4)) * 3).to(torch.bfloat16)
    q, s = fp8quant.per_block_quant(w)
    deq = (q.float() * s.repeat_interleave(128, 1)[:, :200].repeat_interleave(128, 2)[:, :, :300]).to(torch.bfloat16)
    want_q, want_s = fp8quant.per_block_quant(deq, ue8m0=True)
    got_q, got_s = R.requantize_ue8m0(q, s)
    assert torch.equal(got_s, want_s) and torch.equal(got_q.view(torch.uint8), want_q.view(torch.uint8))
