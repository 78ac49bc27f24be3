"""Exact, independent arithmetic for the tests: float32 rounding, e4m3fn encoding and UE8M0
bytes computed from first principles with :class:`fractions.Fraction` (no torch numerics), so
the reference can be checked against values that do not come from the reference itself.
"""

from __future__ import annotations

import math
import struct
from fractions import Fraction

import torch

F32_MIN_EXP = -126  # exponent of the smallest normal float32
F32_MANT_BITS = 23
E4M3_MAX = 448
E4M3_NAN = 0x7F


def f32_bits(v: float) -> int:
    """The IEEE bit pattern of float32 ``v``."""
    return struct.unpack("<I", struct.pack("<f", v))[0]


def f32_from_bits(bits: int) -> float:
    return struct.unpack("<f", struct.pack("<I", bits))[0]


def _floor_log2(a: Fraction) -> int:
    """floor(log2(a)) for a positive Fraction, exactly."""
    e = a.numerator.bit_length() - a.denominator.bit_length()
    if Fraction(2) ** e > a:
        e -= 1
    assert Fraction(2) ** e <= a < Fraction(2) ** (e + 1)
    return e


def _round_half_even(n: Fraction) -> int:
    q, r = divmod(n.numerator, n.denominator)
    twice = 2 * r
    if twice > n.denominator or (twice == n.denominator and q % 2 == 1):
        q += 1
    return q


def f32_round(v: Fraction | float | int) -> float:
    """``v`` rounded to the nearest float32 (ties to even), overflow not handled.

    A negative value that rounds to zero gives -0.0 (a Fraction cannot hold -0 itself).
    """
    v = Fraction(v)
    if v == 0:
        return 0.0
    sign = -1 if v < 0 else 1
    a = abs(v)
    e = max(_floor_log2(a), F32_MIN_EXP)  # below 2^-126 the quantum stays 2^-149
    ulp = Fraction(2) ** (e - F32_MANT_BITS)
    out = _round_half_even(a / ulp) * ulp
    assert out < Fraction(2) ** 128
    return math.copysign(float(out), sign)


def f32_div(a: float, b: float) -> float:
    """IEEE float32 division of two finite float32 numbers (b != 0), correctly rounded,
    signed zeros included."""
    if a == 0:
        return math.copysign(0.0, math.copysign(1.0, a) * math.copysign(1.0, b))
    return f32_round(Fraction(a) / Fraction(b))


def e4m3_byte(v: float) -> int:
    """float8_e4m3fn byte of float ``v``: round to nearest even, saturate to ±448, NaN -> 0x7F.

    e4m3fn: 1 sign bit, 4 exponent bits (bias 7), 3 mantissa bits; exponent 0 is subnormal
    (m * 2^-9); 0x7E = 1.75 * 2^8 = 448 is the largest finite value and 0x7F the NaN.
    """
    if math.isnan(v):
        return E4M3_NAN
    sign = 0x80 if math.copysign(1.0, v) < 0 else 0
    if math.isinf(v):
        return sign | 0x7E
    a = Fraction(abs(v))
    if a == 0:
        return sign
    e = max(_floor_log2(a), -6)  # 2^-6 is the smallest normal
    quantum = Fraction(2) ** (e - 3)
    n = _round_half_even(a / quantum)  # integer multiple of the quantum, 0..16
    value = n * quantum
    if value > E4M3_MAX:
        return sign | 0x7E
    if value == 0:
        return sign
    if value < Fraction(1, 64):  # subnormal: m * 2^-9
        return sign | int(value * 512)
    e = _floor_log2(value)
    mant = int((value / Fraction(2) ** e - 1) * 8)
    return sign | ((e + 7) << 3) | mant


def ue8m0_byte(s: float) -> int:
    """UE8M0 byte of a positive float32 scale: exponent + (mantissa != 0), clamped to [1, 254]."""
    bits = f32_bits(s)
    return min(max((bits >> 23) + ((bits & 0x7FFFFF) != 0), 1), 254)


def ue8m0_value(e: int) -> float:
    return math.ldexp(1.0, e - 127)


def expected_group(values: list[float], *, ue8m0: bool, eps: float = 1e-10) -> tuple[float, int, list[int]]:
    """(float32 scale, UE8M0 byte, q bytes) of one group of float32 values, by SPEC section 1."""
    finite = [abs(v) for v in values if math.isfinite(v)]
    eps32 = f32_round(eps)
    amax = max([eps32, *finite])
    scale = f32_div(amax, 448.0)
    byte = ue8m0_byte(scale)
    if ue8m0:
        scale = ue8m0_value(byte)
    q = []
    for v in values:
        if math.isfinite(v):
            q.append(e4m3_byte(f32_div(v, scale)))
        else:
            q.append(e4m3_byte(v))  # ±inf saturate, NaN stays NaN
    return scale, byte, q


def full_buffer(t: torch.Tensor) -> torch.Tensor:
    """Every element of t's underlying storage (padding included), as a flat tensor of t's dtype."""
    n = t.untyped_storage().nbytes() // t.element_size()
    return torch.as_strided(t, (n,), (1,), 0)
