"""CPU tests of the RMSNorm references and ops (docs/contract.md, "RMSNorm"): hand-computed
values, the contract's order of the sum of squares, the inverse RMS correctly rounded step by step
(exact rational arithmetic), agreement with torch.nn.functional.rms_norm within one rounding, the
residual updated in place (eagerly and under torch.compile), the fused op equal to the pair, and
argument checks (the kernels' H limit on the CPU too)."""

from __future__ import annotations

import math
from fractions import Fraction

import pytest
import torch

import fp8quant
from fp8quant import reference as R


def test_hand_values():
    # One row of 16: h = x + residual = [3, 4, 0, ...]; mean square = 25 / 16; r = 1 / sqrt(25/16 + 0) = 0.8
    x = torch.zeros(1, 16, dtype=torch.bfloat16)
    x[0, 0], x[0, 1] = 1.0, 4.0
    res = torch.zeros(1, 16, dtype=torch.bfloat16)
    res[0, 0] = 2.0
    w = torch.full((16,), 2.0, dtype=torch.bfloat16)
    y, h = R.rms_norm(x, w, 0.0, residual=res)
    assert h[0, :2].tolist() == [3.0, 4.0]
    assert y[0, :2].tolist() == [4.8125, 6.40625]  # 3 * 0.8 and 4 * 0.8 rounded to bf16 (2.40625, 3.203125), times 2
    assert y[0, 2:].abs().sum() == 0


def test_sum_of_squares_order():
    """The contract's order, spelled out for H = 1024: 64 slice sums, runs of 32 folded by halves,
    then the two run totals added. A value that rounds away only in another order shows it."""
    g = torch.Generator().manual_seed(0)
    h = torch.randn(3, 1024, generator=g).to(torch.bfloat16).float()
    slices = []
    for i in range(64):
        s = h[:, 16 * i] * h[:, 16 * i]  # squares of these values are exact: no fused multiply-add needed
        for j in range(1, 16):
            s = s + h[:, 16 * i + j] * h[:, 16 * i + j]
        slices.append(s)
    runs = []
    for r in range(2):
        v = slices[32 * r : 32 * r + 32]
        while len(v) > 1:
            half = len(v) // 2
            v = [v[i] + v[i + half] for i in range(half)]
        runs.append(v[0])
    assert torch.equal(R.sum_of_squares(h), runs[0] + runs[1])
    # Another order gives other bits for some rows: the test can tell orders apart
    big = torch.randn(64, 7168, generator=g).to(torch.bfloat16).float()
    assert not torch.equal(R.sum_of_squares(big), (big * big).sum(1))


def _floor_log2(a: Fraction) -> int:
    e = a.numerator.bit_length() - a.denominator.bit_length()  # floor(log2 a) or one more
    return e - 1 if Fraction(2) ** e > a else e


def _round_to_float32(x: Fraction, mantissa: int = 23) -> Fraction:
    """x rounded to the nearest float32 (bfloat16 with ``mantissa=7``), ties to even, subnormals
    included (x within range)."""
    if x == 0:
        return x
    a = abs(x)
    e = _floor_log2(a)
    quantum = Fraction(2) ** (max(e, -126) - mantissa)
    n = a / quantum
    whole = n.numerator // n.denominator
    rest = n - whole
    if rest > Fraction(1, 2) or (rest == Fraction(1, 2) and whole % 2):
        whole += 1
    return (1 if x > 0 else -1) * whole * quantum


def _sqrt_to_float32(v: Fraction) -> Fraction:
    """sqrt(v) rounded to the nearest float32, exactly (v > 0 a float32: the root is normal)."""
    quantum = Fraction(2) ** (_floor_log2(v) // 2 - 23)  # sqrt(v) in [2^e, 2^(e + 1)), e = floor(log2 v) // 2
    t = v / quantum**2  # sqrt(t) in [2^23, 2^24)
    whole = math.isqrt(t.numerator * t.denominator) // t.denominator  # floor(sqrt(t))
    half = Fraction(2 * whole + 1, 2)
    if t > half * half or (t == half * half and whole % 2):
        whole += 1
    return whole * quantum


def _inverse_rms(ss: float, h: int, eps: float) -> Fraction:
    """The contract's r = 1 / sqrt(ss / H + eps), each step rounded to float32, in exact arithmetic."""
    eps32 = Fraction(torch.tensor(eps, dtype=torch.float32).item())
    v = _round_to_float32(_round_to_float32(Fraction(ss) / h) + eps32)
    return _round_to_float32(1 / _sqrt_to_float32(v))


def test_inverse_rms_is_correctly_rounded():
    """Each step of r = 1 / sqrt(sum / H + eps) correctly rounded to float32, against exact rational
    arithmetic, sums from subnormal to near the float32 maximum. 32 + 2^-17 over 16 is 2 + 2^-21,
    whose float32 square root torch's float32 sqrt rounds the wrong way on an AVX-512 CPU."""
    g = torch.Generator().manual_seed(5)
    for h, eps in ((16, 0.0), (7168, 1e-6), (16384, 1e-5)):
        mantissas = 1 + torch.rand(3000, generator=g, dtype=torch.float64)
        exponents = torch.randint(-145, 124, (3000,), generator=g, dtype=torch.float64)  # sum / 16 >= 2^-149
        ss = (mantissas * torch.exp2(exponents)).float()
        ss = torch.cat([ss, torch.tensor([32 + 2.0**-17, 2.0**-145, 3 * 2.0**-140, torch.finfo(torch.float32).max])])
        got = R.inverse_rms(ss, h, eps)
        want = [_inverse_rms(v, h, eps) for v in ss.tolist()]
        assert [Fraction(r) for r in got.tolist()] == want
    root = _sqrt_to_float32(2 + Fraction(1, 2**21))
    assert root == Fraction(1.41421377658844)  # 0x3FB504F5; torch's float32 sqrt gives 0x3FB504F4 there
    assert Fraction(R.inverse_rms(torch.tensor([32 + 2.0**-17]), 16, 0.0).item()) == _round_to_float32(1 / root)
    assert R.inverse_rms(torch.zeros(1), 16, 0.0).item() == math.inf


def test_rms_norm_of_a_row_exactly():
    """y of one bf16 row, computed step by step in exact arithmetic: its r (eps 1e-6) has a square
    root that torch's float32 sqrt on an AVX-512 CPU rounds the wrong way, which changes y[8]."""
    x = torch.tensor(
        [16215, 16151, -16413, -16601, -16442, 16017, 16335, -16505, 16349, 16140, -16628, -16375, -16532, 16263,
         -16763, 16010], dtype=torch.int16,
    ).view(torch.bfloat16).unsqueeze(0)  # fmt: skip
    ss = Fraction(0)
    for v in map(Fraction, x.float()[0].tolist()):
        ss = _round_to_float32(ss + v * v)  # a fused multiply-add: one rounding a term
    r = _inverse_rms(float(ss), 16, 1e-6)
    want = [_round_to_float32(_round_to_float32(Fraction(v) * r), mantissa=7) for v in x.float()[0].tolist()]
    y = R.rms_norm(x, torch.ones(16, dtype=torch.bfloat16), 1e-6)
    assert [Fraction(v) for v in y.float()[0].tolist()] == want
    assert torch.equal(fp8quant.rms_norm(x, torch.ones(16, dtype=torch.bfloat16), 1e-6), y)


def test_slice_sums_are_fused_multiply_adds():
    """A 16-element slice sums by fused multiply-adds (one rounding a term), checked in exact
    rational arithmetic on bf16 values near 2^-72, whose squares fall below float32's normal
    range and round: there a multiply then an add gives other sums, so the test tells them apart."""
    g = torch.Generator().manual_seed(3)
    h = (torch.randn(64, 16, generator=g) * 2.0**-72).to(torch.bfloat16).float()
    got = R.sum_of_squares(h)  # one slice: the folds add zeros
    fused, separate = [], []
    for row in h.tolist():
        f = s = Fraction(0)
        for v in map(Fraction, row):
            f = _round_to_float32(f + v * v)
            s = _round_to_float32(s + _round_to_float32(v * v))
        fused.append(f)
        separate.append(s)
    assert [Fraction(v) for v in got.tolist()] == fused
    assert fused != separate


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
@pytest.mark.parametrize("h", [128, 7168, 16384])
def test_within_one_rounding_of_torch(h, dtype):
    g = torch.Generator().manual_seed(h)
    x = torch.randn(16, h, generator=g).to(dtype)
    w = (1 + 0.5 * torch.randn(h, generator=g)).to(dtype)
    y = R.rms_norm(x, w, 1e-6)
    want = torch.nn.functional.rms_norm(x, (h,), w, 1e-6)
    mantissa, min_exp = (7, -126) if dtype == torch.bfloat16 else (10, -14)  # below min_exp: subnormal spacing
    ulp = torch.exp2(torch.floor(torch.log2(want.float().abs().clamp(min=1e-30))).clamp(min=min_exp) - mantissa)
    assert bool(((y.float() - want.float()).abs() <= ulp).all())


def test_ops_on_cpu_update_the_residual_and_match_the_composition():
    g = torch.Generator().manual_seed(1)
    x, res0 = torch.randn(5, 256, generator=g).to(torch.bfloat16), torch.randn(5, 256, generator=g).to(torch.bfloat16)
    w = torch.randn(256, generator=g).to(torch.bfloat16)
    res = res0.clone()
    q, s, r = fp8quant.rms_norm_quant(x, w, residual=res, scale_layout="mn_tma")
    assert r is res and torch.equal(res, (x.float() + res0.float()).to(torch.bfloat16))
    y = R.rms_norm(x, w, residual=res0)[0]
    q2, s2 = R.per_token_group_quant(y, 128, scale_layout="mn_tma")
    assert torch.equal(q.view(torch.uint8), q2.view(torch.uint8)) and torch.equal(s, s2)
    y2, r2 = fp8quant.rms_norm(x, w, residual=res0.clone())
    assert torch.equal(y2, y) and torch.equal(r2, res)


def test_compiled_residual_update():
    g = torch.Generator().manual_seed(2)
    x, res0 = torch.randn(4, 128, generator=g).to(torch.bfloat16), torch.randn(4, 128, generator=g).to(torch.bfloat16)
    w = torch.randn(128, generator=g).to(torch.bfloat16)
    torch._dynamo.reset()
    fn = torch.compile(lambda x, w, r: fp8quant.rms_norm(x, w, residual=r), fullgraph=True)
    res = res0.clone()
    y, _ = fn(x, w, res)
    want_y, want_h = R.rms_norm(x, w, residual=res0)
    assert torch.equal(y, want_y) and torch.equal(res, want_h)
    torch._dynamo.reset()


def test_argument_errors():
    x = torch.randn(2, 128).to(torch.bfloat16)
    w = torch.ones(128, dtype=torch.bfloat16)
    with pytest.raises(TypeError, match="x must be a bfloat16 or float16 tensor"):
        fp8quant.rms_norm(x.float(), w)
    with pytest.raises(TypeError, match=r"weight must be a torch.bfloat16 tensor \[128\]"):
        fp8quant.rms_norm(x, w[:64])
    with pytest.raises(ValueError, match=r"^h: must be a positive multiple of 16, at most 16384, got 120$"):
        fp8quant.rms_norm(x[:, :120], w[:120])
    with pytest.raises(ValueError, match=r"^H must be a positive multiple of 16, got 120$"):
        R.rms_norm(x[:, :120], w[:120])
    with pytest.raises(TypeError, match="residual must be a torch.bfloat16 tensor of x's shape"):
        fp8quant.rms_norm(x, w, residual=x[:1])
    for eps in (-1.0, float("nan"), float("inf"), 3.5e38):  # 3.5e38 is past the largest float32
        with pytest.raises(ValueError, match=r"^eps must be a float32 number >= 0"):
            fp8quant.rms_norm(x, w, eps)
    with pytest.raises(ValueError, match="must be a positive multiple of group_size"):
        fp8quant.rms_norm_quant(x[:, :96], w[:96])
    for fn in (fp8quant.rms_norm_quant, R.rms_norm_quant):
        with pytest.raises(ValueError, match=r"^quant_eps must be a positive float32 number"):
            fn(x, w, quant_eps=0.0)


def test_kernel_h_limit_on_the_cpu():
    """H = 16400 is past the kernels' 16384 (16 * 1024 threads): refused on the CPU with the GPU's
    message, before either path; the reference takes it."""
    x = torch.randn(2, 16400).to(torch.bfloat16)
    w = torch.ones(16400, dtype=torch.bfloat16)
    for fn in (fp8quant.rms_norm, fp8quant.rms_norm_quant):
        for residual in (None, x.clone()):
            with pytest.raises(ValueError, match=r"^h: must be a positive multiple of 16, at most 16384, got 16400$"):
                fn(x, w, residual=residual)
    assert R.rms_norm(x, w).shape == (2, 16400)
    x, w = x[:, :16384], w[:16384]
    assert torch.equal(fp8quant.rms_norm(x, w), R.rms_norm(x, w))


def test_residual_must_not_overlap_what_the_op_reads():
    """On the CPU as the C API does on the GPU: the residual, written in place, shares no byte
    with x or the weight, with or without out=; read-only inputs may share memory."""
    x = torch.randn(4, 128).to(torch.bfloat16)
    stream = torch.ones(4 * 128, dtype=torch.bfloat16)
    res, w = stream.view(4, 128), stream[:128]  # the weight is the residual's first row
    for residual, weight, message in ((x, w.clone(), "residual overlaps x"), (res, w, "weight overlaps residual")):
        for out in (None, torch.empty(4, 128, dtype=torch.bfloat16)):
            with pytest.raises(ValueError, match=rf"^{message}: what the op writes"):
                fp8quant.rms_norm(x, weight, residual=residual, out=out)
    shared = torch.randn(2, 128).to(torch.bfloat16)
    y = fp8quant.rms_norm(shared, shared[0])  # x and weight share memory, neither is written
    assert torch.equal(y, R.rms_norm(shared, shared[0].clone()))


@pytest.mark.parametrize("op", ["rms_norm", "rms_norm_quant", "rms_norm_mxfp8", "rms_norm_nvfp4"])
@pytest.mark.parametrize("with_out", [False, True])
def test_residual_rows_must_not_overlap(op, with_out):
    """A residual whose rows share elements (row stride 128 < H = 256, or 0) is refused on the CPU
    as the C API refuses it on the GPU ("rows of residual must not overlap"): the op writes each
    row in place, so overlapping rows would read what another row wrote. It is left untouched."""
    x, w = torch.randn(8, 256).to(torch.bfloat16), torch.randn(256).to(torch.bfloat16)
    fn = getattr(fp8quant, op)
    args = (x, w, torch.tensor(1.0)) if op == "rms_norm_nvfp4" else (x, w)
    good = fn(*args, residual=torch.zeros_like(x))  # (y, residual) or (q, scale, residual)
    out = None
    if with_out:
        out = torch.empty_like(good[0]) if op == "rms_norm" else (torch.empty_like(good[0]), torch.empty_like(good[1]))
    overlapping = (
        torch.randn(2000).to(torch.bfloat16).as_strided((8, 256), (128, 1)),
        torch.randn(256).to(torch.bfloat16).expand(8, 256),
    )
    for residual in overlapping:
        before = residual.clone()
        message = rf"^residual must not overlap itself, got strides \({residual.stride(0)}, 1\)$"
        with pytest.raises(ValueError, match=message):
            fn(*args, residual=residual, out=out)
        assert torch.equal(residual, before)
