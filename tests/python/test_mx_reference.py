"""The MXFP8 reference (fp8quant.reference.mx, docs/contract.md "MXFP8"): scale bytes and
elements against hand-computed values for both recipes, the edge cases (zero groups, NaN, inf,
subnormal and largest amax), the swizzled layout against its formula, and bit-exactness against
torchao 0.18 on the CPU wherever its recipe is the one implemented (and the measured departures
where it is not)."""

from __future__ import annotations

import pytest
import torch

from fp8quant.reference import mx

F32 = torch.float32


def amax_bytes(values, recipe):
    return mx.e8m0_bytes(torch.tensor(values, dtype=F32), recipe).tolist()


def test_bytes_by_hand():
    """448 * 2^k: byte 127 + k under both recipes. 672 = 1.3125 * 2^9: amax / 448 = 1.5 rounds up
    to 2 (RCEIL 128), and FLOOR's 9 - 8 is 128 too (significand 1.3125 <= 1.75). 500 = 1.953 *
    2^8: RCEIL 128 (500 / 448 = 1.116 -> 2), FLOOR 127 (8 - 8). amax 0: byte 0."""
    assert amax_bytes([448.0, 896.0, 224.0, 448.0 * 2.0**-100], "rceil") == [127, 128, 126, 27]
    assert amax_bytes([448.0, 896.0, 224.0, 448.0 * 2.0**-100], "floor") == [127, 128, 126, 27]
    assert amax_bytes([672.0, 500.0, 0.0], "rceil") == [128, 128, 0]
    assert amax_bytes([672.0, 500.0, 0.0], "floor") == [128, 127, 0]


def test_bytes_at_the_ends():
    """RCEIL's d = amax / 448 below the normal range: up to 2^-127 it is byte 0 (2^-127), above
    byte 1 (2^-126); the largest float32 amax gives 2^128 / 448 -> byte 247 (RCEIL), 246 (FLOOR:
    exponent 254 - 8). FLOOR of a subnormal amax clamps to 0."""
    tiny = [448.0 * 2.0**-128, 448.0 * 1.5 * 2.0**-127, 448.0 * 2.0**-127]
    assert amax_bytes(tiny, "rceil") == [0, 1, 0]
    big = torch.finfo(F32).max
    assert amax_bytes([big], "rceil") == [247] and amax_bytes([big], "floor") == [246]
    assert amax_bytes([2.0**-140], "floor") == [0]


def test_rceil_is_the_smallest_power_of_two_at_or_above():
    """For 2^16 random finite float32 amax (every exponent): 2^(e - 127) >= RN(amax / 448) >
    2^(e - 128), in float64, unless e is 0 (RN(amax / 448) <= 2^-127) or 254 (the cap)."""
    bits = torch.randint(0, 0x7F800000, (1 << 16,), dtype=torch.int32, generator=torch.Generator().manual_seed(4))
    amax = bits.view(F32)
    e = mx.e8m0_bytes(amax, "rceil").double()
    d = (amax.double() / 448.0).float().double()
    assert ((2.0 ** (e - 127) >= d) | (e == 254)).all()
    assert ((2.0 ** (e - 128) < d) | (e == 0)).all()


def test_floor_is_rceil_minus_one_exactly_above_1_75():
    """FLOOR = RCEIL - 1 exactly when amax's significand is above 1.75, else equal (every
    significand of bf16, at three exponents)."""
    mant = torch.arange(128, dtype=torch.int32)
    bits = torch.cat([((e << 7) | mant) << 16 for e in (100, 127, 200)])
    amax = bits.view(F32)
    rceil, floor = mx.e8m0_bytes(amax, "rceil"), mx.e8m0_bytes(amax, "floor")
    above = (amax / 2.0 ** torch.floor(torch.log2(amax))) > 1.75
    assert torch.equal(rceil - floor, above.to(torch.int32))


def test_elements_by_hand():
    """One group of amax 448 -> scale 1 (byte 127): -447 rounds to -448 (e4m3 steps by 32 there);
    1.0625 lies halfway between e4m3's 1.0 and 1.125 and goes to the even 1.0; NaN stays the
    canonical NaN byte; inf is not in amax and saturates to 448; an all-zero group gets byte 0."""
    x = torch.zeros(2, 32, dtype=F32)
    x[0, :6] = torch.tensor([448.0, -447.0, 1.0625, float("nan"), float("inf"), 0.5])
    q, s = mx.mxfp8_quant(x, scale_layout="row")
    assert s.view(torch.uint8).tolist() == [[127], [0]]
    b = q.view(torch.uint8)
    assert b[0, :6].tolist() == [0x7E, 0xFE, 0x38, 0x7F, 0x7E, 0x30]
    assert b[1].eq(0).all()


def test_recipes_differ_on_elements():
    """amax 500: RCEIL divides by 2 (500 -> 250), FLOOR by 1 (500 saturates to 448)."""
    x = torch.zeros(1, 32, dtype=F32)
    x[0, 0] = 500.0
    assert mx.mxfp8_quant(x, recipe="rceil")[0].float()[0, 0].item() == 256.0  # 250 rounds to 256
    assert mx.mxfp8_quant(x, recipe="floor")[0].float()[0, 0].item() == 448.0


def test_swizzled_offsets_formula_and_padding():
    """Scale (r, c) of a [200, 7] matrix at (r // 128) * 2 * 512 + (c // 4) * 512 + (r % 32) * 16
    + ((r % 128) // 32) * 4 + c % 4 in a 256 x 8 buffer; every other byte 0; and back."""
    s = torch.randint(1, 255, (200, 7), dtype=torch.uint8, generator=torch.Generator().manual_seed(0))
    sw = mx.to_swizzled(s)
    assert sw.shape == (256, 8)
    flat = sw.flatten()
    for r, c in [(0, 0), (1, 0), (31, 3), (32, 0), (127, 4), (128, 0), (199, 6), (37, 5)]:
        offset = (r // 128) * 2 * 512 + (c // 4) * 512 + (r % 32) * 16 + ((r % 128) // 32) * 4 + c % 4
        assert flat[offset] == s[r, c]
    assert int((flat != 0).sum()) == 200 * 7
    assert torch.equal(mx.from_swizzled(sw, 200, 7), s)


def test_batched_input_has_a_scale_matrix_per_batch():
    x = torch.randn(3, 5, 64, generator=torch.Generator().manual_seed(1)).to(torch.bfloat16)
    q, s = mx.mxfp8_quant(x, scale_layout="swizzled")
    assert q.shape == x.shape and s.shape == (3, 128, 4)
    for b in range(3):
        qb, sb = mx.mxfp8_quant(x[b], scale_layout="swizzled")
        assert torch.equal(q[b].view(torch.uint8), qb.view(torch.uint8))
        assert torch.equal(s[b].view(torch.uint8), sb.view(torch.uint8))


@pytest.mark.parametrize("recipe", mx.MX_RECIPES)
def test_dequant_round_trip(recipe):
    """dequant(quant(x)) is within e4m3's half-ulp (2^-4 relative) plus the scale's headroom."""
    x = torch.randn(64, 256, generator=torch.Generator().manual_seed(2)) * 10
    q, s = mx.mxfp8_quant(x, recipe=recipe, scale_layout="swizzled")
    back = mx.mxfp8_dequant(q, s, scale_layout="swizzled")
    scale = mx.mxfp8_dequant(torch.ones_like(q), s, scale_layout="swizzled")  # each element's 2^(e - 127)
    err = (back - x).abs()
    bound = torch.maximum(x.abs() * 2.0**-4, scale * 2.0**-10)  # half an ulp: normal, or e4m3's subnormal step
    if recipe == "rceil":  # FLOOR may saturate a group's largest elements
        assert (err <= bound).all()
    assert (err / x.abs().clamp(min=1e-3)).median() < 2.0**-5


# --- against torchao 0.18 on the CPU ----------------------------------------------------------


@pytest.fixture(scope="module")
def torchao_mx():
    pytest.importorskip("torchao", minversion="0.18")
    from torchao.prototype.mx_formats import mx_tensor, utils  # noqa: PLC0415

    return mx_tensor, utils


def _torchao_mode(mx_tensor, recipe):
    return {"rceil": mx_tensor.ScaleCalculationMode.RCEIL, "floor": mx_tensor.ScaleCalculationMode.FLOOR}[recipe]


@pytest.mark.parametrize("recipe", mx.MX_RECIPES)
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
def test_bit_exact_with_torchao(torchao_mx, recipe, dtype):
    """Random groups whose amax is neither 0 nor near the edges: torchao's to_mx gives the same
    scale bytes and e4m3 bytes for both recipes (float32 inputs drawn so that no amax lies just
    above 448 * 2^k, torchao's RCEIL departure, tested below)."""
    mx_tensor, _ = torchao_mx
    gen = torch.Generator().manual_seed(3)
    x = (torch.randn(128, 512, generator=gen) * torch.exp(torch.randn(128, 16, 1, generator=gen) * 4).expand(
        128, 16, 32).reshape(128, 512)).to(dtype)  # fmt: skip
    if dtype == torch.float32:  # keep amax / 448 off exact powers of two's next floats
        x = x.to(torch.bfloat16).to(F32)
    s_ref, q_ref = mx_tensor.to_mx(x, torch.float8_e4m3fn, 32, _torchao_mode(mx_tensor, recipe))
    q, s = mx.mxfp8_quant(x, recipe=recipe, scale_layout="row")
    assert torch.equal(s.view(torch.uint8), s_ref.view(torch.uint8))
    assert torch.equal(q.view(torch.uint8), q_ref.view(torch.uint8))


def test_swizzle_matches_torchao_to_blocked(torchao_mx):
    _, utils = torchao_mx
    for rows, cols in [(1, 1), (128, 4), (200, 7), (300, 33)]:
        s = torch.randint(0, 255, (rows, cols), dtype=torch.uint8, generator=torch.Generator().manual_seed(rows))
        assert torch.equal(mx.to_swizzled(s).flatten(), utils.to_blocked(s).flatten())


def test_torchao_rceil_departure_on_float32(torchao_mx):
    """torchao's RCEIL takes ceil(log2(amax / 448)) in float32: log2(2^10 * (1 + 2^-23)) rounds to
    exactly 10 there, so it misses the round-up when amax / 448 is one ulp above 2^k (k >= 4);
    fp8quant follows the recipe on the bit pattern (2^11, byte 138)."""
    mx_tensor, _ = torchao_mx
    x = torch.zeros(1, 32, dtype=F32)
    x[0, 0] = torch.tensor(448.0 * 1024, dtype=F32).view(torch.int32).add(1).view(F32)  # amax / 448 = 1024 + 1 ulp
    s_ref, _ = mx_tensor.to_mx(x, torch.float8_e4m3fn, 32, _torchao_mode(mx_tensor, "rceil"))
    _, s = mx.mxfp8_quant(x, scale_layout="row")
    assert s.view(torch.uint8).item() == 138
    assert s_ref.view(torch.uint8).item() == 137


def test_torchao_departures_at_the_edges(torchao_mx):
    """Where torchao departs from the recipes, measured: FLOOR scales a byte-0 group by 2^-126 (its
    float32 scale is clamped to the smallest normal) where the recipe's is 2^-127; an inf in a
    group makes FLOOR's byte 247 (fp8quant: amax over the finite elements); a NaN makes the byte
    255 and, under FLOOR, the group's finite elements 0 (fp8quant: NaN is dropped from amax and
    stays NaN in q, as in the FP8 quantizer)."""
    mx_tensor, _ = torchao_mx
    floor = _torchao_mode(mx_tensor, "floor")
    x = torch.zeros(3, 32, dtype=F32)
    x[0, 0] = 2.0**-135  # FLOOR byte 0: x / 2^-127 = 2^-8, torchao's x / 2^-126 = 2^-9
    x[1, :2] = torch.tensor([float("inf"), 1.0])
    x[2, :2] = torch.tensor([float("nan"), 1.0])
    s_ref, q_ref = mx_tensor.to_mx(x, torch.float8_e4m3fn, 32, floor)
    q, s = mx.mxfp8_quant(x, recipe="floor", scale_layout="row")
    assert s.view(torch.uint8).flatten().tolist() == [0, 119, 119]  # amax 1: 2^(0 - 8)
    assert s_ref.view(torch.uint8).flatten().tolist() == [0, 247, 255]
    assert q.float()[0, 0].item() == 2.0**-8 and q_ref.float()[0, 0].item() == 2.0**-9
    assert q.float()[1, :2].tolist() == [448.0, 256.0] and q_ref.float()[1, 1].item() == 0.0
    assert q.view(torch.uint8)[2, 0].item() == 0x7F and q.float()[2, 1].item() == 256.0
    assert q_ref.float()[2, 1].item() == 0.0
