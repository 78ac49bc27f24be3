"""fp8quant.reference against values computed by hand (SPEC.md section 1 and 2).

Expected bytes are either literals derived from the float8_e4m3fn format (1 sign bit, 4 exponent
bits with bias 7, 3 mantissa bits; 0x7E = 448 is the largest finite value, 0x7F the NaN) or come
from the exact Fraction arithmetic of ``handmath``, never from the reference itself.
"""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch
from handmath import (
    e4m3_byte,
    expected_group,
    f32_bits,
    f32_div,
    f32_from_bits,
    f32_round,
    full_buffer,
    ue8m0_byte,
)
from hypothesis import given, settings
from hypothesis import strategies as st

from fp8quant import reference
from fp8quant.layouts import align

DTYPES = (torch.float32, torch.bfloat16, torch.float16)
LAYOUTS = ("row", "mn", "mn_tma", "packed_ue8m0")


def qbytes(q: torch.Tensor) -> list:
    assert q.dtype == torch.float8_e4m3fn
    return q.view(torch.uint8).tolist()


def exact_input(values, dtype, shape=None) -> torch.Tensor:
    """A tensor of ``values`` in ``dtype``, asserting every value is exactly representable."""
    x32 = torch.tensor(values, dtype=torch.float32)
    x = x32.to(dtype)
    assert torch.equal(x.float(), x32) or torch.isnan(x32).any(), "test input not exact in dtype"
    return x if shape is None else x.reshape(shape)


def group_with_amax(amax: float, group_size: int = 128, *, seed: int = 0) -> list[float]:
    """A group whose largest magnitude is ``amax`` (at position 5, negative); the other values
    are random multiples n * 2^(E-5), |n| < 32, of amax's power of two 2^E, so they are exact
    in bfloat16 and float16 whenever amax is."""
    g = torch.Generator().manual_seed(seed)
    unit = 2.0 ** (math.floor(math.log2(amax)) - 5)
    vals = (torch.randint(-31, 32, (group_size,), generator=g) * unit).tolist()
    vals[5] = -amax
    return vals


# --- the hand-written oracle itself --------------------------------------------------------


def test_hand_encoder_matches_every_e4m3_value():
    """handmath.e4m3_byte maps each finite e4m3fn value back to its own byte."""
    values = torch.arange(256, dtype=torch.uint8).view(torch.float8_e4m3fn).float().tolist()
    nan_bytes = [b for b, v in enumerate(values) if math.isnan(v)]
    assert nan_bytes == [0x7F, 0xFF]
    for b, v in enumerate(values):
        if b not in nan_bytes:
            assert e4m3_byte(v) == b, (hex(b), v)
    assert values[0x7E] == 448.0 and values[0x01] == 2.0**-9 and values[0x08] == 2.0**-6


def test_hand_f32_rounding():
    assert f32_round(1) == 1.0
    assert f32_round(1 + 2.0**-24) == 1.0  # tie to even
    assert f32_round(1 + 3 * 2.0**-24) == 1 + 2 * 2.0**-23  # tie to even (up)
    assert f32_round(2.0**-150) == 0.0  # tie between 0 and the smallest subnormal
    assert f32_round(3 * 2.0**-151) == 2.0**-149
    assert math.copysign(1.0, f32_round(-(2.0**-151))) == -1.0  # negative underflow -> -0.0
    assert math.copysign(1.0, f32_div(-0.0, 3.0)) == -1.0
    assert f32_bits(f32_round(1e-10)) == 0x2EDBE6FF


# --- SPEC worked values ----------------------------------------------------------------------


@pytest.mark.parametrize("dtype", DTYPES)
def test_all_zero_group(dtype):
    x = torch.zeros(3, 256, dtype=dtype)
    x[1, :128] = exact_input(group_with_amax(448.0), dtype)  # only group (1, 0) is non-zero
    expected = f32_div(f32_round(1e-10), 448.0)  # float32(1e-10) / 448, correctly rounded
    assert f32_bits(expected) == 0x2A7B5123

    q, s = reference.per_token_group_quant(x, 128, scale_layout="row")
    assert s.dtype == torch.float32
    assert s[0].tolist() == [expected, expected]
    assert s[1].tolist() == [1.0, expected]
    assert qbytes(q[0]) == [0] * 256
    assert qbytes(q[1, 128:]) == [0] * 128

    _, s8 = reference.per_token_group_quant(x, 128, scale_layout="row", ue8m0=True)
    assert s8[0].tolist() == [2.0**-42, 2.0**-42]

    _, packed = reference.per_token_group_quant(x, 128, scale_layout="packed_ue8m0")
    assert packed.dtype == torch.int32
    assert packed[:, 0].tolist() == [0x5555, 0x557F, 0x5555]


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize(
    "amax, fp32_scale, ue8m0_scale, byte",
    [(448.0, 1.0, 1.0, 0x7F), (672.0, 1.5, 2.0, 0x80), (224.0, 0.5, 0.5, 0x7E), (336.0, 0.75, 1.0, 0x7F)],
)
def test_worked_amax(dtype, amax, fp32_scale, ue8m0_scale, byte):
    x = exact_input(group_with_amax(amax, 128), dtype, (1, 128))
    _, s = reference.per_token_group_quant(x, 128, scale_layout="row")
    _, s8 = reference.per_token_group_quant(x, 128, scale_layout="mn", ue8m0=True)
    _, packed = reference.per_token_group_quant(x, 128, scale_layout="packed_ue8m0")
    assert s.item() == fp32_scale
    assert s8.item() == ue8m0_scale
    assert packed.item() == byte


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("k", [-20, -7, -1, 0, 1, 3, 7])
def test_power_of_two_amax_gives_exact_scale(dtype, k):
    amax = 448.0 * 2.0**k
    x = exact_input(group_with_amax(amax, 64, seed=k + 100), dtype, (1, 64))
    _, s = reference.per_token_group_quant(x, 64)
    _, s8 = reference.per_token_group_quant(x, 64, ue8m0=True)
    _, packed = reference.per_token_group_quant(x, 64, scale_layout="packed_ue8m0")
    assert s.item() == 2.0**k
    assert s8.item() == 2.0**k
    assert packed.item() == 127 + k


@pytest.mark.parametrize("k", [-100, -60, 40, 100])
def test_power_of_two_amax_wide_range(k):
    amax = 448.0 * 2.0**k
    for dtype in (torch.float32, torch.bfloat16):
        x = exact_input(group_with_amax(amax, 32, seed=7), dtype, (1, 32))
        _, s = reference.per_token_group_quant(x, 32, eps=1e-30)
        _, packed = reference.per_token_group_quant(x, 32, scale_layout="packed_ue8m0", eps=1e-30)
        assert s.item() == 2.0**k
        assert packed.item() == 127 + k


# --- q bytes of specific values ---------------------------------------------------------------

# (value at scale 1, float8_e4m3fn byte), derived from the format by hand.
Q_TABLE = [
    (448.0, 0x7E),  # 1.75 * 2^8: e=15, m=6 (largest finite; sets amax so the scale is 1)
    (-448.0, 0xFE),
    (1.0, 0x38),  # e=7, m=0
    (1.125, 0x39),  # m=1
    (1.0625, 0x38),  # tie between m=0 and m=1 -> even m=0
    (1.1875, 0x3A),  # tie between m=1 and m=2 -> even m=2
    (-1.0625, 0xB8),
    (3.0, 0x44),  # 1.5 * 2^1: e=8, m=4
    (-2.5, 0xC2),  # 1.25 * 2^1: e=8, m=2
    (0.5, 0x30),  # e=6, m=0
    (240.0, 0x77),  # 1.875 * 2^7: e=14, m=7
    (400.0, 0x7C),  # tie between 384 (m=4) and 416 (m=5) -> 384
    (424.0, 0x7D),  # nearest is 416 (m=5)
    (432.0, 0x7E),  # tie between 416 (m=5) and 448 (m=6) -> 448
    (440.0, 0x7E),
    (0.0, 0x00),
    (-0.0, 0x80),  # the sign of zero is kept
    (2.0**-6, 0x08),  # smallest normal
    (2.0**-7, 0x04),  # subnormal 4 * 2^-9
    (2.0**-9, 0x01),  # smallest subnormal
    (3 * 2.0**-9, 0x03),
    (-(2.0**-9), 0x81),
    (7.5 * 2.0**-9, 0x08),  # tie between 7 * 2^-9 (0x07) and 2^-6 (0x08) -> even 0x08
    (8.5 * 2.0**-9, 0x08),  # tie between 0x08 and 0x09 -> even 0x08
    (9 * 2.0**-9, 0x09),
    (1.5 * 2.0**-9, 0x02),  # tie between 1 and 2 subnormal quanta -> 2
    (2.5 * 2.0**-9, 0x02),  # tie between 2 and 3 -> 2
    (2.0**-10, 0x00),  # tie between 0 and 2^-9 -> 0
    (1.25 * 2.0**-10, 0x01),  # above the tie -> 2^-9
    (-(2.0**-10), 0x80),  # rounds to -0
    (-(2.0**-11), 0x80),
    (2.0**-12, 0x00),  # far below half the smallest subnormal
]
assert len(Q_TABLE) == 32


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("scale", [1.0, 1.5, 2.0**-10])
def test_q_bytes_by_hand(dtype, scale):
    """x = scale * v quantizes to v's byte when the group's amax is 448 * scale."""
    values = [scale * v for v, _ in Q_TABLE]
    x = exact_input(values, dtype, (1, 32))
    q, s = reference.per_token_group_quant(x, 32)
    assert s.item() == scale
    assert qbytes(q[0]) == [b for _, b in Q_TABLE]


# Values (at scale 1) below 336 from Q_TABLE, plus a few more, for a group of amax 672.
Q_TABLE_672 = [(v, b) for v, b in Q_TABLE if abs(v) <= 336] + [
    (336.0, 0x7A),  # 1.3125 * 2^8: e=15, m=2.5 -> tie -> even m=2 (320)
    (-336.0, 0xFA),
    (300.0, 0x79),  # 1.171875 * 2^8: m=1.375 -> m=1 (288)
    (170.0, 0x73),  # 1.328125 * 2^7: e=14, m=2.625 -> m=3 (176)
    (0.75, 0x34),  # 1.5 * 2^-1: e=6, m=4
    (-0.375, 0xAC),  # 1.5 * 2^-2: e=5, m=4
]
assert len(Q_TABLE_672) == 32


def test_q_bytes_with_rounded_up_scale():
    """amax 672 with ue8m0: the scale rounds up from 1.5 to 2, so x = 2 * v gives v's byte."""
    x = exact_input([2.0 * v for v, _ in Q_TABLE_672], torch.float32, (1, 32))
    q, s = reference.per_token_group_quant(x, 32, ue8m0=True)
    assert s.item() == 2.0
    assert qbytes(q[0]) == [b for _, b in Q_TABLE_672]
    q, s = reference.per_token_group_quant(x, 32)  # fp32 scale 1.5: checked through the oracle
    assert s.item() == 1.5
    assert qbytes(q[0]) == [e4m3_byte(f32_div(2.0 * v, 1.5)) for v, _ in Q_TABLE_672]


@pytest.mark.parametrize("dtype", DTYPES)
def test_nan_and_inf(dtype):
    neg_nan = -float("nan")
    values = [float("nan"), neg_nan, math.inf, -math.inf, 1.0, 448.0, -3.0, 0.0] * 4
    x = torch.tensor(values, dtype=torch.float32).to(dtype).reshape(1, 32)
    assert torch.signbit(x[0, 1]) and torch.isnan(x[0, 1])  # the second NaN really is negative
    q, s = reference.per_token_group_quant(x, 32)
    assert s.item() == 1.0  # inf and NaN are ignored by amax
    assert qbytes(q[0]) == [0x7F, 0x7F, 0x7E, 0xFE, 0x38, 0x7E, 0xC4, 0x00] * 4


def test_non_finite_only_group_uses_eps():
    x = torch.tensor([[math.inf, -math.inf, float("nan"), 0.0] * 8], dtype=torch.float32)
    q, s = reference.per_token_group_quant(x, 32)
    assert s.item() == f32_div(f32_round(1e-10), 448.0)
    assert qbytes(q[0]) == [0x7E, 0xFE, 0x7F, 0x00] * 8
    _, packed = reference.per_token_group_quant(x, 32, scale_layout="packed_ue8m0")
    assert packed.item() == 0x55


# --- eps -----------------------------------------------------------------------------------------


def test_eps_sets_the_floor_of_amax():
    g = torch.Generator().manual_seed(3)
    small = (torch.rand(32, generator=g) - 0.5) * 6e-5  # amax < 3e-5 < eps
    big = torch.randn(32, generator=g)
    x = torch.stack([torch.zeros(32), small, big]).reshape(1, 96)
    eps_scale = f32_div(f32_round(1e-4), 448.0)
    q, s = reference.per_token_group_quant(x, 32, eps=1e-4)
    big_amax = big.abs().max().item()
    assert s[0].tolist() == [eps_scale, eps_scale, f32_div(big_amax, 448.0)]
    assert qbytes(q[0, :32]) == [0] * 32
    assert qbytes(q[0, 32:64]) == [e4m3_byte(f32_div(v, eps_scale)) for v in small.tolist()]

    _, packed = reference.per_token_group_quant(x, 32, eps=1e-4, scale_layout="packed_ue8m0")
    # 1e-4 / 448 = 2.23e-7 lies in [2^-23, 2^-22): exponent bits 104, mantissa != 0 -> 105
    assert packed.item() & 0xFFFF == 0x6969

    # With the default eps the small group gets its own, much smaller, scale.
    _, s_default = reference.per_token_group_quant(x, 32)
    assert s_default[0, 1].item() == f32_div(small.abs().max().item(), 448.0)
    assert s_default[0, 0].item() == f32_div(f32_round(1e-10), 448.0)


# --- IEEE division ---------------------------------------------------------------------------


def _reciprocal_multiply_differs(a: float) -> bool:
    return float(np.float32(a) * (np.float32(1.0) / np.float32(448.0))) != f32_div(a, 448.0)


def test_scale_is_ieee_division_not_reciprocal_multiply():
    # Random float32 values where amax * float32(1/448) is one ulp off amax / 448.
    rng = np.random.default_rng(1234)
    candidates = [float(a) for a in rng.uniform(1.0, 1000.0, 200).astype(np.float32)]
    amaxes = [a for a in candidates if _reciprocal_multiply_differs(a)][:8]
    assert len(amaxes) == 8
    rows = []
    for i, a in enumerate(amaxes):
        row = group_with_amax(a, 32, seed=i)
        rows.append(row)
    x = torch.tensor(rows, dtype=torch.float32)
    q, s = reference.per_token_group_quant(x, 32)
    assert s[:, 0].tolist() == [f32_div(a, 448.0) for a in amaxes]
    for i, row in enumerate(rows):
        assert qbytes(q[i]) == [e4m3_byte(f32_div(v, s[i, 0].item())) for v in row]


def test_known_division_pitfall_value():
    amax = 637.32470703125  # float32; amax * float32(1/448) = 1.4225999117 (one ulp high)
    expected = f32_div(amax, 448.0)
    assert expected == 1.4225997924804688
    assert _reciprocal_multiply_differs(amax)
    x = torch.tensor([[amax] + [1.0] * 31], dtype=torch.float32)
    q, s = reference.per_token_group_quant(x, 32)
    assert s.item() == expected
    assert qbytes(q[0])[1:] == [e4m3_byte(f32_div(1.0, expected))] * 31


def test_q_division_is_ieee():
    """q = float32(x / s) exactly, then e4m3: checked on random rows of random magnitudes."""
    g = torch.Generator().manual_seed(11)
    x = torch.randn(16, 64, generator=g) * torch.logspace(-6, 6, 16).unsqueeze(1)
    q, s = reference.per_token_group_quant(x, 64)
    for i in range(16):
        scale = s[i, 0].item()
        assert scale == f32_div(x[i].abs().max().item(), 448.0)
        assert qbytes(q[i]) == [e4m3_byte(f32_div(v, scale)) for v in x[i].tolist()]


# --- UE8M0 rounding ----------------------------------------------------------------------------


@pytest.mark.parametrize(
    "bits, e",
    [
        (0x3F800000, 127),  # 1.0: mantissa 0 stays
        (0x3FC00000, 128),  # 1.5 -> 2
        (0x3F800001, 128),  # next float after 1 -> 2
        (0x3F7FFFFF, 127),  # largest float below 1 -> 1
        (0x2A7B5123, 0x55),  # float32(1e-10) / 448 -> 2^-42
        (0x00800000, 1),  # 2^-126
        (0x00000001, 1),  # smallest subnormal: exponent 0 + 1
        (0x007FFFFF, 1),  # largest subnormal
        (0x00000000, 1),  # zero clamps to 1
        (0x7F000000, 254),  # 2^127
        (0x7F000001, 254),  # would be 255: clamped
        (0x7F7FFFFF, 254),  # float32 max: clamped
    ],
)
def test_ue8m0_round_up_bits(bits, e):
    s = torch.tensor([bits], dtype=torch.int64).to(torch.int32).view(torch.float32)
    rounded, got_e = reference.ue8m0_round_up(s)
    assert got_e.item() == e
    assert got_e.dtype == torch.int32
    assert rounded.view(torch.int32).item() == e << 23
    assert ue8m0_byte(f32_from_bits(bits)) == e  # the hand helper agrees


def test_ue8m0_just_above_and_below_a_power_of_two():
    ulp = 2.0**-15  # float32 spacing in [256, 512)
    above, below = 448.0 + ulp, 448.0 - ulp
    x = torch.tensor([[above] * 32 + [below] * 32], dtype=torch.float32)
    _, s = reference.per_token_group_quant(x, 32)
    _, s8 = reference.per_token_group_quant(x, 32, ue8m0=True)
    assert s[0].tolist() == [1.0 + 2.0**-23, 1.0 - 2.0**-24]  # both one ulp from 1
    assert s8[0].tolist() == [2.0, 1.0]


@pytest.mark.parametrize("k", [-40, -12, 12, 40])
def test_ue8m0_one_ulp_above_a_large_power_of_two(k):
    """s = 2^k * (1 + 2^-23) must round up to 2^(k+1); float32 log2(s) rounds to k for |k| >= 2,
    which is why SPEC forbids exp2(ceil(log2(s)))."""
    amax = 448.0 * 2.0**k
    above = float(np.nextafter(np.float32(amax), np.float32(np.inf)))
    below = float(np.nextafter(np.float32(amax), np.float32(0)))
    x = torch.tensor([[above] * 32 + [below] * 32 + [amax] * 32], dtype=torch.float32)
    _, s = reference.per_token_group_quant(x, 32, eps=1e-30)
    _, s8 = reference.per_token_group_quant(x, 32, ue8m0=True, eps=1e-30)
    assert s[0].tolist() == [2.0**k * (1 + 2.0**-23), 2.0**k * (1 - 2.0**-24), 2.0**k]
    assert s8[0].tolist() == [2.0 ** (k + 1), 2.0**k, 2.0**k]
    assert torch.log2(s[0, :1]).item() == k  # the float32 log2 trap this guards against


# --- dtypes, shapes and group sizes against the oracle ------------------------------------------


def random_input(shape, dtype, seed) -> torch.Tensor:
    """Normal values with per-row magnitudes from 1e-5 to 1e4 and a few outliers."""
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(shape, generator=g)
    rows = x.shape[-2]
    x = x * torch.logspace(-5, 4, rows).unsqueeze(-1)
    x.view(-1)[::97] *= 30.0
    if dtype == torch.float16:
        x = x.clamp(-60000, 60000)
    return x.to(dtype)


def check_against_oracle(x: torch.Tensor, group_size: int, *, ue8m0: bool, eps: float = 1e-10):
    q, s = reference.per_token_group_quant(x, group_size, ue8m0=ue8m0, eps=eps)
    xf = x.float().reshape(-1, x.shape[-1])
    qf = q.reshape(-1, x.shape[-1])
    sf = s.reshape(-1, s.shape[-1])
    for r in range(xf.shape[0]):
        for gi in range(x.shape[-1] // group_size):
            sl = slice(gi * group_size, (gi + 1) * group_size)
            scale, _, qb = expected_group(xf[r, sl].tolist(), ue8m0=ue8m0, eps=eps)
            assert sf[r, gi].item() == scale, (r, gi)
            assert qbytes(qf[r, sl]) == qb, (r, gi)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("group_size", [32, 64, 128])
@pytest.mark.parametrize("ue8m0", [False, True])
def test_random_2d_against_oracle(dtype, group_size, ue8m0):
    x = random_input((6, 384), dtype, seed=group_size + 3 * ue8m0)
    check_against_oracle(x, group_size, ue8m0=ue8m0)


@pytest.mark.parametrize("dtype", DTYPES)
def test_random_3d_against_oracle(dtype):
    x = random_input((2, 5, 256), dtype, seed=42)
    check_against_oracle(x, 128, ue8m0=False, eps=1e-4)


@pytest.mark.parametrize("layout", LAYOUTS)
def test_3d_blocks_equal_2d_results(layout):
    x = random_input((3, 5, 384), torch.bfloat16, seed=5)
    q, s = reference.per_token_group_quant(x, 128, scale_layout=layout)
    ma = align(5, 4)
    cols = 1 if layout == "packed_ue8m0" else 3
    rows = ma if layout in ("mn_tma", "packed_ue8m0") else 5
    assert s.shape == (3, 5, cols)
    assert s.stride(0) == rows * cols
    assert full_buffer(s).numel() == 3 * rows * cols
    for b in range(3):
        qb, sb = reference.per_token_group_quant(x[b], 128, scale_layout=layout)
        assert torch.equal(q[b].view(torch.uint8), qb.view(torch.uint8))
        assert torch.equal(s[b], sb)
        assert torch.equal(full_buffer(s)[b * rows * cols : (b + 1) * rows * cols], full_buffer(sb))


# --- layouts: values and padding -----------------------------------------------------------------


def test_layout_values_and_padding():
    x = random_input((5, 384), torch.float32, seed=9)
    _, row = reference.per_token_group_quant(x, 128, scale_layout="row")
    assert row.shape == (5, 3) and row.stride() == (3, 1)
    expected = [[f32_div(x[m, 128 * g : 128 * (g + 1)].abs().max().item(), 448.0) for g in range(3)] for m in range(5)]
    assert row.tolist() == expected

    _, mn = reference.per_token_group_quant(x, 128, scale_layout="mn")
    assert mn.stride() == (1, 5)
    assert full_buffer(mn).tolist() == [expected[m][g] for g in range(3) for m in range(5)]

    _, tma = reference.per_token_group_quant(x, 128, scale_layout="mn_tma")
    assert tma.stride() == (1, 8)
    assert tma.untyped_storage().nbytes() == 3 * 8 * 4
    assert full_buffer(tma).tolist() == [expected[m][g] if m < 5 else 0.0 for g in range(3) for m in range(8)]


def _packed_input(m_rows: int, amax_exponents: list[int]) -> torch.Tensor:
    """Row r, group g has amax 448 * 2^(amax_exponents[g] + r)."""
    groups = []
    for g, k in enumerate(amax_exponents):
        cols = []
        for r in range(m_rows):
            cols.append(group_with_amax(448.0 * 2.0 ** (k + r), 128, seed=10 * g + r))
        groups.append(torch.tensor(cols, dtype=torch.float32))
    return torch.cat(groups, dim=1)


def test_packed_byte_order_odd_groups():
    # G = 3 (K = 384): one word per row, byte j = group j, byte 3 (group 3 >= G) is 0.
    x = _packed_input(5, [0, 2, -3])  # bytes 0x7F, 0x81, 0x7C in row 0
    _, p = reference.per_token_group_quant(x, 128, scale_layout="packed_ue8m0")
    assert p.dtype == torch.int32 and p.shape == (5, 1) and p.stride() == (1, 8)
    assert p[:, 0].tolist() == [0x007C817F + r * 0x00010101 for r in range(5)]
    assert full_buffer(p).tolist() == [0x007C817F + r * 0x00010101 for r in range(5)] + [0, 0, 0]


def test_packed_byte_order_two_words_and_sign_bit():
    # G = 5 (K = 640): word 0 holds groups 0..3 (byte 3 = 0x80 sets the int32 sign bit),
    # word 1 holds group 4 in its low byte and zeros above.
    x = _packed_input(3, [0, 2, -3, 1, -20])  # bytes 0x7F, 0x81, 0x7C, 0x80, 0x6B in row 0
    _, p = reference.per_token_group_quant(x, 128, scale_layout="packed_ue8m0")
    assert p.shape == (3, 2) and p.stride() == (1, 4)
    word0 = [0x807C817F + r * 0x01010101 - 2**32 for r in range(3)]
    word1 = [0x6B + r for r in range(3)]
    assert p[:, 0].tolist() == word0
    assert p[:, 1].tolist() == word1
    assert full_buffer(p).tolist() == word0 + [0] + word1 + [0]
    # Little-endian bytes of row 0, word 0, read through a uint8 view of the buffer.
    assert full_buffer(p).view(torch.uint8)[:4].tolist() == [0x7F, 0x81, 0x7C, 0x80]


def test_packed_matches_ue8m0_fp32_scales():
    x = random_input((7, 1024), torch.bfloat16, seed=21)  # G = 8
    _, p = reference.per_token_group_quant(x, 128, scale_layout="packed_ue8m0")
    _, s8 = reference.per_token_group_quant(x, 128, scale_layout="row", ue8m0=True)
    words = p.tolist()
    for m in range(7):
        for g in range(8):
            byte = (words[m][g // 4] >> (8 * (g % 4))) & 0xFF
            assert s8[m, g].item() == 2.0 ** (byte - 127)
    assert full_buffer(p)[7::8].tolist() == [0, 0]  # padding row 7 of both columns


# --- properties -----------------------------------------------------------------------------------

finite_f32 = st.floats(width=32, allow_nan=False, allow_infinity=False)


@settings(max_examples=60, deadline=None, database=None)
@given(values=st.lists(finite_f32, min_size=32, max_size=32), ue8m0=st.booleans())
def test_property_finite_groups(values, ue8m0):
    x = torch.tensor([values], dtype=torch.float32)
    q, s = reference.per_token_group_quant(x, 32, ue8m0=ue8m0)
    scale = s.item()
    exp_scale, _, exp_q = expected_group(values, ue8m0=ue8m0)
    assert scale == exp_scale
    assert qbytes(q[0]) == exp_q
    if ue8m0:
        assert f32_bits(scale) & 0x7FFFFF == 0  # a power of two
    # Dequantized values are within e4m3 rounding error of x (half an ulp: 2^-4 relative for
    # normals, 2^-10 * scale absolute below 2^-6 * scale), up to float32 rounding of x / scale.
    deq = q[0].double() * scale
    for v, d in zip(values, deq.tolist()):
        bound = max(abs(v) * 2.0**-4, 2.0**-10 * scale) * (1 + 2.0**-20)
        assert abs(d - v) <= bound, (v, d, scale)
