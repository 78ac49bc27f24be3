"""GPU tests of ``fp8quant.per_token_group_quant``: the CUDA kernel must be bit-identical to
``fp8quant.reference.per_token_group_quant`` called with the same arguments (SPEC.md).

The checks come from the shared harness (gpu_harness.py): raw bytes compared, q as uint8 and
scales over the *whole* buffer behind the scale view (padding rows included); ``out=`` buffers
poisoned (0xA5 bytes in q, the NaN 0x7FC0DEAD in scales) with poisoned guards around them; the
allocating path run over a dirtied caching allocator; side streams and CUDA graphs.

Covered: every scale format x dtype x group size over many shapes (the full cross product for
bf16 groups of 128, a reduced one elsewhere); 3-D input; special values (signed zeros, NaNs,
infinities, subnormals, exact 448*2^k maxima, e4m3 rounding ties, eps-dominated groups); scales
below 2^-90 where the kernel leaves its fast division; every finite bf16/fp16 bit pattern;
random fp32 mantissas against the fast division; misaligned and strided x and q; empty input;
large M (grid limits) and more than 2^31 elements; streams; CUDA graphs and programmatic
dependent launch on and off; a PDL producer that writes x late (also tests/cpp/test_pdl.cu, in
C); torch.compile in every dynamic-shape mode; the eager call's structure (no dispatcher round
trip, only the outputs allocated: what the host-overhead bench times, checked without a clock);
an end-to-end torch._scaled_mm consumer check; and error reporting on the GPU path.

All tests are marked ``gpu``: conftest.py skips them without a compute capability 9.0 or 10.x
device. The whole file takes a few minutes on an H200 (torch.compile dominates).
"""

from __future__ import annotations

import functools
import math

import pytest
import torch
from gpu_harness import (
    BYTE_POISON,
    FP8,
    WORD_POISON,
    PoisonedOutputs,
    StreamGate,
    assert_bitwise_equal,
    assert_direct_eager_call,
    bits,
    check_graph,
    check_op,
    check_pdl_producer,
    check_side_stream,
    pdl_setting,
)
from gpu_harness import (
    check_geometry as harness_check_geometry,
)

import fp8quant
from fp8quant import SCALE_FORMATS as FORMATS
from fp8quant import reference
from fp8quant._ext import LAYOUT_CODES
from fp8quant._ops import Buffer
from fp8quant.quant import _extension
from fp8quant.quant import _quant as QUANT

pytestmark = pytest.mark.gpu

SCALE_POISON = WORD_POISON  # a NaN as float32; never a valid scale or packed word here
DEFAULT_EPS = 1e-10
F32_TINY = torch.finfo(torch.float32).tiny  # 2^-126, the smallest eps the API accepts
FAST_DIV_MIN_SCALE = 2.0**-90  # below this scale the kernel divides with __fdiv_rn

DTYPES = (torch.bfloat16, torch.float16, torch.float32)
GROUP_SIZES = (32, 64, 128)
DTYPE_NAMES = {torch.bfloat16: "bf16", torch.float16: "fp16", torch.float32: "fp32"}


def _format_id(layout: str, ue8m0: bool) -> str:
    return layout if layout == "packed_ue8m0" or not ue8m0 else f"{layout}-ue8m0"


def format_params(formats=FORMATS):
    return [pytest.param(layout, ue8m0, id=_format_id(layout, ue8m0)) for layout, ue8m0 in formats]


ALL_FORMATS = format_params()
# One fp32-scale, one UE8M0 fp32 and the packed format: enough where the layout is not the point.
FEW_FORMATS = format_params((("row", False), ("mn_tma", True), ("packed_ue8m0", True)))


# --------------------------------------------------------------------------------------------
# The op through the harness (gpu_harness.py): quantization-specific wrappers
# --------------------------------------------------------------------------------------------


def spec_of(x: torch.Tensor, group_size: int, layout: str) -> fp8quant.ScaleSpec:
    return fp8quant.scale_spec(layout, x.shape[-2], x.shape[-1] // group_size, tuple(x.shape[:-2]))


def buffers_of(x, group_size, layout, ue8m0=False, eps=DEFAULT_EPS):
    """The op's declared output geometry: (q, scale buffer)."""
    return QUANT.buffers(x, group_size, layout, ue8m0, eps)


def full_buffer(scale: torch.Tensor, spec: fp8quant.ScaleSpec) -> torch.Tensor:
    """The whole buffer behind a scale view (padding included), flat, as int32 bits."""
    return bits(scale.as_strided((spec.numel,), (1,)))


def locator(spec: fp8quant.ScaleSpec):
    """Where flat element ``index`` of a scale buffer sits: batch, row and column."""

    def locate(index: int) -> str:
        block = spec.rows * spec.cols
        b, r = divmod(index, block)
        if spec.layout == "row":
            m, c = divmod(r, spec.cols)
        else:
            c, m = divmod(r, spec.rows)
        pad = " (a padding row)" if m >= spec.shape[-2] else ""
        return f"batch {b}, row {m}, column {c}{pad}"

    return locate


def compare_outputs(q, scale, ref_q, ref_scale, spec, x, label: str) -> None:
    assert_bitwise_equal(q, ref_q, f"{label}: q", x=x)
    assert_bitwise_equal(
        full_buffer(scale, spec), full_buffer(ref_scale, spec), f"{label}: scale buffer",
        locate=locator(spec), value_dtype=spec.dtype,
    )  # fmt: skip


def check_geometry(q: torch.Tensor, scale: torch.Tensor, x: torch.Tensor, spec) -> None:
    """Allocated outputs (the harness's check): q like x, contiguous; scale with the layout's
    dtype, shape and strides over a storage that holds its padding."""
    buffers = (Buffer(FP8, tuple(x.shape)), Buffer(spec.dtype, spec.shape, spec.stride, spec.numel))
    harness_check_geometry((q, scale), buffers, x.device)


def poisoned_outputs(x, group_size, layout, **kwargs) -> PoisonedOutputs:
    """Poisoned out= (q, scale) for ``x``: ``row_pad`` / ``offset`` shift q's rows and start."""
    return PoisonedOutputs.new(buffers_of(x, group_size, layout), x.device, **kwargs)


def quant(x, group_size, layout, ue8m0, eps=DEFAULT_EPS, out=None):
    return fp8quant.per_token_group_quant(x, group_size, scale_layout=layout, ue8m0=ue8m0, eps=eps, out=out)


def ref_quant(x, group_size, layout, ue8m0, eps=DEFAULT_EPS):
    return reference.per_token_group_quant(x, group_size, scale_layout=layout, ue8m0=ue8m0, eps=eps)


def check_quant(x, group_size, layout, ue8m0, eps=DEFAULT_EPS, *, ref=None, out_kwargs=None):
    """The harness's check_op: poisoned out= buffers, then allocated outputs over a dirtied
    allocator, both bit-identical to the reference (padding included), nothing written outside.
    Returns the allocated ``(q, scale)``."""
    ref = ref if ref is not None else ref_quant(x, group_size, layout, ue8m0, eps)
    return check_op(
        lambda out=None: quant(x, group_size, layout, ue8m0, eps, out=out), ref,
        buffers_of(x, group_size, layout, ue8m0, eps), x=x, locate=locator(spec_of(x, group_size, layout)),
        out_kwargs=out_kwargs,
    )  # fmt: skip


# --------------------------------------------------------------------------------------------
# Inputs
# --------------------------------------------------------------------------------------------

_INT_OF = {torch.bfloat16: torch.int16, torch.float16: torch.int16, torch.float32: torch.int32}
_WIDTH = {torch.bfloat16: 16, torch.float16: 16, torch.float32: 32}
_MANT_BITS = {torch.bfloat16: 7, torch.float16: 10, torch.float32: 23}


def from_bits(patterns, dtype) -> torch.Tensor:
    """A CPU tensor of ``dtype`` with these (unsigned) bit patterns."""
    w = _WIDTH[dtype]
    signed = [p - (1 << w) if p >= 1 << (w - 1) else p for p in patterns]
    return torch.tensor(signed, dtype=_INT_OF[dtype]).view(dtype)


def from_bits_value(v: float, dtype) -> int:
    """The bit pattern of ``v`` rounded to ``dtype``."""
    return int(torch.tensor([v]).to(dtype).view(_INT_OF[dtype]).item()) & ((1 << _WIDTH[dtype]) - 1)


def _nan_bits(dtype, *, negative=False, signaling=False) -> int:
    w, m = _WIDTH[dtype], _MANT_BITS[dtype]
    exponent = ((1 << (w - 1 - m)) - 1) << m
    mantissa = 1 if signaling else (1 << (m - 1)) | 1  # quiet NaNs carry a payload too
    return (1 << (w - 1) if negative else 0) | exponent | mantissa


def _e4m3_midpoints() -> list[float]:
    """The midpoints between consecutive non-negative e4m3 values up to 448 (rounding ties)."""
    values = sorted(torch.arange(0, 0x7F, dtype=torch.uint8).view(FP8).float().tolist())
    return [(a + b) / 2 for a, b in zip(values, values[1:])]


@functools.cache
def special_groups(dtype: torch.dtype, group_size: int) -> torch.Tensor:
    """Groups of special values, one a row: ``[P, group_size]`` of ``dtype`` on the CPU."""
    gs = group_size
    gen = torch.Generator().manual_seed(1000 + gs)
    info = torch.finfo(dtype)
    wide = dtype != torch.float16  # bf16 and fp32 share the float32 exponent range
    sign = 1 << (_WIDTH[dtype] - 1)
    qnan, neg_qnan = _nan_bits(dtype), _nan_bits(dtype, negative=True)
    snan, neg_snan = _nan_bits(dtype, signaling=True), _nan_bits(dtype, negative=True, signaling=True)

    def rnd(scale=1.0):
        return (torch.randn(gs, generator=gen).clamp(-4, 4) * scale).to(dtype)

    def patch(t, **at):  # set elements by bit pattern: patch(t, i5=0x7FC1)
        t = t.clone()
        for key, pattern in at.items():
            t[int(key[1:])] = from_bits([pattern], dtype)[0]
        return t

    def cycle(patterns):
        return from_bits([patterns[i % len(patterns)] for i in range(gs)], dtype)

    groups = [
        torch.zeros(gs, dtype=dtype),  # all zero: scale eps/448
        cycle([sign]),  # all -0
        patch(cycle([0, sign]), i3=from_bits_value(1.5, dtype)),  # ±0 with one value
        patch(rnd(), i5=qnan),
        patch(rnd(), i0=from_bits_value(math.inf, dtype)),
        patch(rnd(10.0), **{f"i{gs - 1}": from_bits_value(-math.inf, dtype), "i3": qnan}),
        patch(rnd(), i1=neg_qnan, i2=snan, i3=neg_snan),
        cycle([qnan, neg_qnan, snan, neg_snan]),  # all NaN: amax = eps
        cycle([from_bits_value(math.inf, dtype), from_bits_value(-math.inf, dtype), qnan, 0, sign]),
        patch(rnd(1e-20 if wide else 1e-3), i7=from_bits_value(math.inf, dtype)),  # inf: IEEE path
        patch(rnd(1.0), i0=from_bits_value(-3.0, dtype), **{f"i{gs - 2}": sign}),
    ]
    # Subnormals of the input dtype, with random signs; then with the smallest normal as max
    mant = torch.randint(1, 1 << _MANT_BITS[dtype], (gs,), generator=gen)
    sub_bits = [int(m) | (sign if i % 3 == 0 else 0) for i, m in enumerate(mant)]
    groups.append(from_bits(sub_bits, dtype))
    groups.append(patch(from_bits(sub_bits, dtype), i1=from_bits_value(info.tiny, dtype)))
    # Group maximum exactly 448 * 2^k: fp32 and UE8M0 scales both 2^k
    for k in (-20, -3, 0, 1, 7) + ((30, 100) if wide else ()):
        t = (torch.randn(gs, generator=gen).clamp(-1, 1) * 448.0 * 2.0**k).to(dtype)
        t[(7 * k) % gs] = (-1) ** k * 448.0 * 2.0**k
        groups.append(t)
    # e4m3 rounding ties: scale exactly 2^k, quotients exactly at midpoints, alternating signs
    mids = _e4m3_midpoints()
    for k in (0, -5, 3):
        vals = [448.0] + [(-1) ** i * mids[i % len(mids)] for i in range(gs - 1)]
        groups.append((torch.tensor(vals) * 2.0**k).to(dtype))
    groups += [
        patch(rnd(info.max / 8), i0=from_bits_value(-info.max, dtype)),  # the dtype's max
        rnd(1e-12),  # below the default eps
        patch(cycle([sign]), **{f"i{gs - 3}": from_bits_value(-3.0, dtype)}),  # one value, rest -0
        patch(rnd(1e-4), i2=from_bits_value(6e4, dtype)),  # one large value, the rest underflow
    ]
    if wide:
        groups += [
            patch(rnd(1e37), i0=from_bits_value(1e38, dtype)),  # huge scale
            patch(rnd(1e-38), i0=from_bits_value(1e-38, dtype)),  # tiny: subnormals among them
            patch(rnd(1e-31), i0=from_bits_value(-1e-30, dtype)),  # scale < 2^-90 with a small eps
            patch(rnd(1e-30), i0=from_bits_value(1e30, dtype)),  # everything else underflows
        ]
    return torch.stack(groups)


def make_input(shape, dtype, group_size, gen, *, spread=3.0, special=False) -> torch.Tensor:
    """Random contiguous CUDA input: normal values times 10**u per group, u ~ U(-spread, spread);
    with ``special``, special groups overwrite randomly chosen groups (as many as fit)."""
    k = shape[-1]
    base = torch.randn(shape, generator=gen, device="cuda")
    expo = (torch.rand((*shape[:-1], k // group_size, 1), generator=gen, device="cuda") * 2 - 1) * spread
    x = (base.unflatten(-1, (k // group_size, group_size)) * 10.0**expo).flatten(-2).to(dtype)
    if special:
        insert_special_groups(x, group_size, gen)
    return x


def insert_special_groups(x: torch.Tensor, group_size: int, gen) -> None:
    groups = x.view(-1, group_size)
    n = groups.shape[0]
    if n == 0:
        return
    patterns = special_groups(x.dtype, group_size).to(x.device)
    p = patterns.shape[0]
    start = int(torch.randint(p, (1,), generator=gen, device="cuda").item())
    count = min(n, p)
    which = (torch.arange(count, device=x.device) + start) % p
    where = torch.randperm(n, generator=gen, device="cuda")[:count]
    groups[where] = patterns[which]


# --------------------------------------------------------------------------------------------
# Formats x dtypes x group sizes x shapes
# --------------------------------------------------------------------------------------------

M_VALUES = (1, 3, 4, 5, 127, 128, 129, 4097)
K_VALUES = (128, 384, 640, 7168)


@pytest.mark.parametrize("k", K_VALUES)
@pytest.mark.parametrize("m", M_VALUES)
@pytest.mark.parametrize("layout,ue8m0", ALL_FORMATS)
def test_bf16_group128_all_shapes(layout, ue8m0, m, k, gen):
    """The hot path, full cross product: G = 1, 3, 5 (odd) and 56; M around multiples of 4."""
    x = make_input((m, k), torch.bfloat16, 128, gen, special=True)
    check_quant(x, 128, layout, ue8m0)


def _reduced_cases():
    # K per group size: each list has an odd G and a G that is not a multiple of 4
    ks = {32: (96, 128, 640, 7168), 64: (192, 384, 640, 7168), 128: (128, 384, 640, 7168)}
    for dtype in DTYPES:
        for gs in GROUP_SIZES:
            if (dtype, gs) == (torch.bfloat16, 128):
                continue  # covered by test_bf16_group128_all_shapes
            for m in (1, 5, 129, 4097):
                for k in ks[gs]:
                    yield pytest.param(dtype, gs, m, k, id=f"{DTYPE_NAMES[dtype]}-g{gs}-m{m}-k{k}")


@pytest.mark.parametrize("dtype,group_size,m,k", list(_reduced_cases()))
@pytest.mark.parametrize("layout,ue8m0", ALL_FORMATS)
def test_dtypes_and_group_sizes(layout, ue8m0, dtype, group_size, m, k, gen):
    x = make_input((m, k), dtype, group_size, gen, special=True)
    check_quant(x, group_size, layout, ue8m0)


@pytest.mark.parametrize("layout,ue8m0", ALL_FORMATS)
@pytest.mark.parametrize("dtype", DTYPES, ids=DTYPE_NAMES.get)
def test_reference_is_device_independent(layout, ue8m0, dtype, gen):
    """The reference gives the same bytes on the GPU and on the CPU, and so does the kernel."""
    x = make_input((37, 640), dtype, 128, gen, special=True)
    ref_gpu = ref_quant(x, 128, layout, ue8m0)
    ref_cpu = ref_quant(x.cpu(), 128, layout, ue8m0)
    spec = spec_of(x, 128, layout)
    compare_outputs(ref_gpu[0], ref_gpu[1], ref_cpu[0], ref_cpu[1], spec, x, "reference cuda vs cpu")
    check_quant(x, 128, layout, ue8m0, ref=ref_cpu)


def test_spec_worked_values():
    """SPEC section 1's worked values, by hand: zero group, amax 448, 672 and 448 * 2^-5."""
    x = torch.zeros((4, 256), dtype=torch.bfloat16, device="cuda")
    x[1, 0], x[2, 5], x[3, 9] = 448.0, -672.0, 448.0 * 2.0**-5
    zero_scale = (torch.tensor(1e-10, dtype=torch.float32).double() / 448).float().item()
    q, s = quant(x, 128, "row", False)
    assert s[:, 0].tolist() == [zero_scale, 1.0, 1.5, 2.0**-5]
    assert s[:, 1].tolist() == [zero_scale] * 4
    qb = q.view(torch.uint8)
    assert qb[1, 0].item() == 0x7E and qb[2, 5].item() == 0xFE and qb[3, 9].item() == 0x7E
    assert int(torch.count_nonzero(qb)) == 3
    _, p = quant(x, 128, "packed_ue8m0", True)
    words = full_buffer(p, spec_of(x, 128, "packed_ue8m0")).tolist()
    # rows 0..3 of word 0: bytes (group 0, group 1, 0, 0)
    assert words == [0x55 | 0x55 << 8, 0x7F | 0x55 << 8, 0x80 | 0x55 << 8, 0x7A | 0x55 << 8]


# --------------------------------------------------------------------------------------------
# 3-D input
# --------------------------------------------------------------------------------------------


def _make_batched(kind, shape, dtype, group_size, gen):
    b, m, k = shape
    if kind == "contiguous":
        return make_input(shape, dtype, group_size, gen, special=True)
    if kind == "batch_minor":  # strides (K, B*K, 1): the batch stride is below the row stride
        return make_input((m, b, k), dtype, group_size, gen, special=True).transpose(0, 1)
    big = make_input((b, m + 2, k + 2 * group_size), dtype, group_size, gen, special=True)
    return big[:, 1 : m + 1, group_size : group_size + k]  # strided rows and batches, aligned


@pytest.mark.parametrize("x_kind", ["contiguous", "batch_minor", "sliced"])
@pytest.mark.parametrize(
    "dtype,group_size,k",
    [(torch.bfloat16, 128, 640), (torch.float32, 32, 96), (torch.float16, 64, 7168)],
    ids=["bf16-g128-k640", "fp32-g32-k96", "fp16-g64-k7168"],
)
@pytest.mark.parametrize("m", [1, 5, 129])
@pytest.mark.parametrize("layout,ue8m0", ALL_FORMATS)
def test_batched_3d(layout, ue8m0, m, dtype, group_size, k, x_kind, gen):
    """[B, M, K]: batch b's scales are its own [M, *] block starting at b * block (SPEC 2)."""
    b = 3
    x = _make_batched(x_kind, (b, m, k), dtype, group_size, gen)
    _, s = check_quant(x, group_size, layout, ue8m0)
    spec = spec_of(x, group_size, layout)
    block = spec.numel // b
    assert s.stride(0) == block
    buf = full_buffer(s, spec)
    for i in range(b):
        _, ref_s = ref_quant(x[i], group_size, layout, ue8m0)
        assert_bitwise_equal(
            buf[i * block : (i + 1) * block],
            full_buffer(ref_s, spec_of(x[i], group_size, layout)),
            f"scale block of batch {i}",
            value_dtype=spec.dtype,
        )


def test_max_batch():
    """B = 65535 (batches are on grid.y)."""
    x = make_input((65535, 1, 128), torch.bfloat16, 128, torch.Generator(device="cuda").manual_seed(7))
    check_quant(x, 128, "packed_ue8m0", True)


# --------------------------------------------------------------------------------------------
# Numerics: special values, extreme magnitudes, exhaustive 16-bit inputs, fp32 division
# --------------------------------------------------------------------------------------------


@pytest.mark.parametrize("eps", [DEFAULT_EPS, 1e-4, F32_TINY, 1.0], ids=["eps1e-10", "eps1e-4", "eps_tiny", "eps1"])
@pytest.mark.parametrize("group_size", GROUP_SIZES)
@pytest.mark.parametrize("dtype", DTYPES, ids=DTYPE_NAMES.get)
@pytest.mark.parametrize("layout,ue8m0", ALL_FORMATS)
def test_special_values(layout, ue8m0, dtype, group_size, eps, gen):
    """Every special group once (rows of 5 groups, the rest random), at several eps."""
    patterns = special_groups(dtype, group_size)
    p = patterns.shape[0]
    m = (p + 16) // 5 + 1
    x = make_input((m, 5 * group_size), dtype, group_size, gen)
    groups = x.view(-1, group_size)
    where = torch.randperm(groups.shape[0], generator=gen, device="cuda")[:p]
    groups[where] = patterns.cuda()
    check_quant(x, group_size, layout, ue8m0, eps)


@pytest.mark.parametrize("eps", [DEFAULT_EPS, F32_TINY], ids=["eps1e-10", "eps_tiny"])
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32], ids=DTYPE_NAMES.get)
@pytest.mark.parametrize("layout,ue8m0", format_params((("row", False), ("mn", False), ("mn_tma", True))))
def test_extreme_magnitudes(layout, ue8m0, dtype, eps, gen):
    """Group magnitudes from 1e-40 to 1e37, all-zero rows: with a tiny eps many scales fall
    below 2^-90 (or are subnormal), where the kernel uses IEEE division instead of its fast one."""
    m, k, gs = 64, 1024, 128
    base = torch.randn((m, k // gs, gs), generator=gen, device="cuda").clamp(-4, 4)
    expo = torch.rand((m, k // gs, 1), generator=gen, device="cuda") * 77 - 40
    x = (base * 10.0**expo).flatten(-2).to(dtype)
    x[0] = 0  # all-zero groups: scale eps / 448 (subnormal for eps = 2^-126)
    _, ref_row = ref_quant(x, gs, "row", False, eps)
    if eps == F32_TINY:
        slow = ref_row < FAST_DIV_MIN_SCALE
        assert int(slow.sum()) > 40, "the slow division path is not exercised"
        assert int((ref_row == 0).sum()) == 0
    check_quant(x, gs, layout, ue8m0, eps)


def _all_finite_patterns_input(dtype, group_size, gen) -> torch.Tensor:
    """Every finite 16-bit pattern of ``dtype``, sorted by magnitude into chunks of
    group_size - 1; each chunk is repeated with an extra element of magnitude
    chunk_amax * 2^t * (1 + u), t = 0..26 (or 0), so every value meets many scales and its
    quotient spans the whole e4m3 range, ties and underflow included. Element order within
    each group is shuffled; rows hold 7 groups (odd G, partial packed words)."""
    info = torch.finfo(dtype)
    vals = torch.arange(-(2**15), 2**15, dtype=torch.int16, device="cuda").view(dtype)
    vals = vals[torch.isfinite(vals)]
    vals = vals[vals.float().abs().argsort(stable=True)]
    per = group_size - 1
    chunks = -(-vals.numel() // per)
    payload = torch.cat([vals, vals.new_zeros(chunks * per - vals.numel())]).view(chunks, per)
    chunk_amax = payload.float().abs().amax(1, keepdim=True)
    groups = []
    for t in range(-1, 27):
        if t < 0:
            extra = torch.zeros_like(chunk_amax)
        else:
            u = torch.rand(chunk_amax.shape, generator=gen, device="cuda")
            sign = torch.where(torch.rand(chunk_amax.shape, generator=gen, device="cuda") < 0.5, -1.0, 1.0)
            extra = sign * (chunk_amax * 2.0**t * (1 + u)).clamp(max=info.max)
        groups.append(torch.cat([payload, extra.to(dtype)], dim=1))
    groups = torch.cat(groups)
    perm = torch.rand(groups.shape, generator=gen, device="cuda").argsort(-1)
    groups = groups.gather(-1, perm)
    pad = -groups.shape[0] % 7
    groups = torch.cat([groups, groups.new_zeros(pad, group_size)])
    return groups.reshape(-1, 7 * group_size)


@pytest.mark.parametrize(
    "layout,ue8m0", format_params((("row", False), ("row", True), ("mn_tma", False), ("packed_ue8m0", True)))
)
@pytest.mark.parametrize("group_size", [32, 128])
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16], ids=DTYPE_NAMES.get)
def test_all_finite_16bit_patterns(dtype, group_size, layout, ue8m0, gen):
    x = _all_finite_patterns_input(dtype, group_size, gen)
    check_quant(x, group_size, layout, ue8m0)


@pytest.mark.parametrize("eps", [DEFAULT_EPS, F32_TINY], ids=["eps1e-10", "eps_tiny"])
@pytest.mark.parametrize("layout,ue8m0", format_params((("row", False), ("mn_tma", False), ("row", True))))
def test_fp32_division_stress(layout, ue8m0, eps, gen):
    """2^24 fp32 elements with random 23-bit mantissas: each group holds its maximum B (random
    sign, exponent and mantissa over the whole normal range) and B * u with |u| in [2^-14, 1),
    so x / s covers the e4m3 range for scales from subnormal to 2^119, fast and IEEE paths."""
    n_groups, gs = 1 << 17, 128

    def random_bits(shape, exponent_lo, exponent_hi):
        r = torch.randint(-(2**31), 2**31, shape, generator=gen, device="cuda", dtype=torch.int64)
        e = torch.randint(exponent_lo, exponent_hi + 1, shape, generator=gen, device="cuda", dtype=torch.int64)
        word = (r & 0x807FFFFF) | (e << 23)
        return torch.where(word >= 2**31, word - 2**32, word).to(torch.int32).view(torch.float32)

    big = random_bits((n_groups, 1), 1, 254)
    u = random_bits((n_groups, gs), 127 - 14, 126)
    x = big * u
    rows = torch.arange(n_groups, device="cuda")
    x[rows, rows % gs] = big[:, 0]
    x = x.view(-1, 8 * gs)
    check_quant(x, gs, layout, ue8m0, eps)


# --------------------------------------------------------------------------------------------
# Alignment and strides
# --------------------------------------------------------------------------------------------

STRIDE_CASES = {
    # name: (how x is laid out, q_row_pad, q_offset)
    "x_misaligned_ptr": ("offset", 0, 0),  # x = big[:, 1:1+K]
    "x_odd_row_stride": ("odd_stride", 0, 0),  # row stride (K+1) elements: not a multiple of 16 B
    "q_odd_row_stride": ("dense", 1, 0),
    "q_misaligned_ptr": ("dense", 16, 1),
    "both_strided_aligned": ("wide", 32, 0),  # strided but 16-byte aligned: vector path
}


@pytest.mark.parametrize("case", list(STRIDE_CASES))
@pytest.mark.parametrize("m", [2, 5, 129])  # 2: with one row, row strides would not matter
@pytest.mark.parametrize("dtype", DTYPES, ids=DTYPE_NAMES.get)
@pytest.mark.parametrize("layout,ue8m0", FEW_FORMATS)
def test_unaligned_and_strided(layout, ue8m0, dtype, m, case, gen):
    """Misaligned or oddly strided x or q take the element-wise path: same bytes; q bytes
    between the rows of a strided q stay untouched."""
    gs, k = 64, 384
    x_kind, q_row_pad, q_offset = STRIDE_CASES[case]
    dense = make_input((m, k), dtype, gs, gen, special=True)
    if x_kind == "offset":
        big = torch.zeros((m, k + 8), dtype=dtype, device="cuda")
        x = big[:, 1 : 1 + k]
    elif x_kind == "odd_stride":
        big = torch.zeros((m, k + 1), dtype=dtype, device="cuda")
        x = big[:, :k]
    elif x_kind == "wide":
        big = torch.zeros((m, k + 64), dtype=dtype, device="cuda")
        x = big[:, :k]
    else:
        x = dense
    if x is not dense:
        x.copy_(dense)
        assert not x.is_contiguous() or m == 1
    check_quant(x, gs, layout, ue8m0, out_kwargs={"row_pad": q_row_pad, "offset": q_offset})


# --------------------------------------------------------------------------------------------
# Sizes: empty, large M, more than 2^31 elements
# --------------------------------------------------------------------------------------------


@pytest.mark.parametrize("shape", [(0, 256), (0, 4, 256), (3, 0, 256)], ids=["M0", "B0", "B3M0"])
@pytest.mark.parametrize("layout,ue8m0", ALL_FORMATS)
def test_empty_input(layout, ue8m0, shape):
    x = torch.empty(shape, dtype=torch.bfloat16, device="cuda")
    spec = spec_of(x, 128, layout)
    q, s = quant(x, 128, layout, ue8m0)
    check_geometry(q, s, x, spec)
    q2 = torch.empty(shape, dtype=FP8, device="cuda")
    s2 = fp8quant.empty_scale(layout, shape[-2], 2, tuple(shape[:-2]), device="cuda")
    r = quant(x, 128, layout, ue8m0, out=(q2, s2))
    assert r[0] is q2 and r[1] is s2
    torch.cuda.synchronize()


@pytest.mark.parametrize("layout,ue8m0", FEW_FORMATS)
def test_large_m(layout, ue8m0, gen):
    """M = 70000 rows of K = 7168: 3.9M groups; rows must be on grid.x, not grid.y."""
    x = make_input((70000, 7168), torch.bfloat16, 128, gen, special=True)
    check_quant(x, 128, layout, ue8m0)


def test_more_than_2pow31_elements(gen):
    """[300001, 7168] bf16 (2.15e9 elements, 4.3 GB): 64-bit offsets. Poisoned out= buffers for
    every layout (and the allocating call for one), every row compared with the reference, run
    on chunks of rows."""
    m, k = 300_001, 7168
    assert m * k > 2**31
    if torch.cuda.mem_get_info()[0] < 24 * 2**30:
        pytest.skip("needs 24 GiB of free GPU memory")
    x = torch.randn((m, k), dtype=torch.bfloat16, device="cuda", generator=gen)
    x.mul_((10.0 ** (torch.rand((m, 1), generator=gen, device="cuda") * 6 - 3)).to(torch.bfloat16))
    x[7, :128] = 0
    chunk = 16384
    for layout, ue8m0, use_out in (
        ("mn_tma", False, True), ("packed_ue8m0", True, True), ("row", False, True), ("row", False, False),
    ):  # fmt: skip
        spec = spec_of(x, 128, layout)
        if use_out:
            q = torch.empty_like(x, dtype=FP8)
            bits(q).fill_(BYTE_POISON)
            s = fp8quant.empty_scale(layout, m, k // 128, device="cuda")
            full_buffer(s, spec).fill_(SCALE_POISON)
            quant(x, 128, layout, ue8m0, out=(q, s))
        else:
            q, s = quant(x, 128, layout, ue8m0)
            check_geometry(q, s, x, spec)
        what = f"{layout}{'' if use_out else ', allocated'}"
        for r0 in range(0, m, chunk):
            rows = slice(r0, min(m, r0 + chunk))
            ref_q, ref_s = ref_quant(x[rows], 128, layout, ue8m0)
            assert_bitwise_equal(q[rows], ref_q, f"{what}: q of rows {r0}..", x=x[rows], value_dtype=FP8)
            assert_bitwise_equal(s[rows], ref_s, f"{what}: scales of rows {r0}..", value_dtype=spec.dtype)
        buf = full_buffer(s, spec)
        if use_out:
            assert not bool((buf == SCALE_POISON).any()), f"{what}: scale buffer not fully written"
        if spec.rows > m:  # padding rows of every column are zero
            assert not bool(buf.view(spec.cols, spec.rows)[:, m:].any()), f"{what}: nonzero padding"
        del q, s, buf
    del x
    torch.cuda.empty_cache()


# --------------------------------------------------------------------------------------------
# Streams, CUDA graphs, torch.compile
# --------------------------------------------------------------------------------------------


def quant_call(x, group_size, layout, ue8m0, eps=DEFAULT_EPS):
    """The harness's call(out=None) for this quantization."""
    return lambda out=None: quant(x, group_size, layout, ue8m0, eps, out=out)


@pytest.mark.parametrize("layout,ue8m0", FEW_FORMATS)
def test_non_default_stream(layout, ue8m0, gen):
    x = make_input((129, 7168), torch.bfloat16, 128, gen, special=True)
    check_side_stream(
        quant_call(x, 128, layout, ue8m0), ref_quant(x, 128, layout, ue8m0), buffers_of(x, 128, layout), x=x
    )


def test_side_stream_check_can_fail(gen):
    """The control of check_side_stream: a call that launches on the default stream, whatever
    the current stream, fails it (the default stream is held while the outputs are compared)."""
    layout, ue8m0 = "mn_tma", False
    x = make_input((129, 7168), torch.bfloat16, 128, gen, special=True)
    call = quant_call(x, 128, layout, ue8m0)

    def on_the_default_stream(out=None):
        with torch.cuda.stream(torch.cuda.default_stream()):
            return call(out=out)

    with pytest.raises(AssertionError, match=r"^gated out= on a side stream: output 0: "):
        check_side_stream(on_the_default_stream, ref_quant(x, 128, layout, ue8m0), buffers_of(x, 128, layout), x=x)


def test_enqueued_on_current_stream(gen):
    """The kernel waits behind a gate (a kernel holding the stream until the host opens it) on
    the current (side) stream: while it is closed the side stream is busy and the scales, read
    on the default stream, are still poison; once it opens they are right."""
    layout, ue8m0 = "mn_tma", False
    x = make_input((4097, 7168), torch.bfloat16, 128, gen, special=True)
    ref_q, ref_s = ref_quant(x, 128, layout, ue8m0)
    out = poisoned_outputs(x, 128, layout)
    q, s = out.outs
    spec = spec_of(x, 128, layout)
    quant(x, 128, layout, ue8m0, out=(q, s))  # loads the kernel first: lazy module loading waits for running kernels
    out.repoison()
    torch.cuda.synchronize()
    side = torch.cuda.Stream()
    gate = StreamGate()
    gate.close(side)
    try:
        with torch.cuda.stream(side):
            quant(x, 128, layout, ue8m0, out=(q, s))
        assert not side.query(), "the side stream finished while its gate was closed"
        early = full_buffer(s, spec)[:64].cpu()  # default stream: does not wait for side
        assert bool((early == SCALE_POISON).all()), "scales were written while the gate was closed"
    finally:
        gate.open()
    side.synchronize()
    assert not gate.timed_out(), "the call waited for its own stream"
    compare_outputs(q, s, ref_q, ref_s, spec, x, "after the gate opened")


@pytest.mark.parametrize("pdl", [True, False], ids=["pdl_on", "pdl_off"])
@pytest.mark.parametrize("variant", ["out", "allocating"])
@pytest.mark.parametrize(
    "layout,ue8m0", format_params((("row", False), ("mn_tma", False), ("mn_tma", True), ("packed_ue8m0", True)))
)
def test_cuda_graph(layout, ue8m0, variant, pdl, gen):
    """Capture, change the input in place, replay (twice): outputs follow the new input, with
    programmatic dependent launch on and off."""
    shape, gs = (129, 640), 128
    x = make_input(shape, torch.bfloat16, gs, gen, special=True)
    with pdl_setting(pdl):
        check_graph(
            quant_call(x, gs, layout, ue8m0),
            lambda: x.copy_(make_input(shape, torch.bfloat16, gs, gen, special=True)),
            lambda: ref_quant(x, gs, layout, ue8m0),
            buffers_of(x, gs, layout),
            variant=variant,
        )


@pytest.mark.parametrize("m", [1, 5, 4097])
@pytest.mark.parametrize("layout,ue8m0", FEW_FORMATS)
def test_pdl_off(layout, ue8m0, m, gen):
    """fp8quant.set_pdl(False) launches plainly: the same bytes, on the default and a side
    stream, and back-to-back calls that each depend on the last (q of one call feeds the next)."""
    x = make_input((m, 7168), torch.bfloat16, 128, gen, special=True)
    ref = ref_quant(x, 128, layout, ue8m0)
    before = fp8quant.pdl_enabled()
    with pdl_setting(False):
        assert not fp8quant.pdl_enabled()
        check_quant(x, 128, layout, ue8m0, ref=ref)
        check_side_stream(quant_call(x, 128, layout, ue8m0), ref, buffers_of(x, 128, layout), x=x)
        chained = x
        for _ in range(3):
            q, _ = quant(chained, 128, layout, ue8m0)
            chained = q.to(torch.bfloat16)
        expected = x
        for _ in range(3):
            expected = ref_quant(expected, 128, layout, ue8m0)[0].to(torch.bfloat16)
        assert_bitwise_equal(chained, expected, "three chained calls")
    assert fp8quant.pdl_enabled() == before, "pdl_setting must restore the setting"


@pytest.mark.parametrize("layout,ue8m0", FEW_FORMATS)
def test_pdl_producer(layout, ue8m0, gen):
    """Behind a producer that lets the kernel launch at once and writes x late, the kernel reads
    the final x and writes nothing before the producer is done (gpu_harness.check_pdl_producer)."""
    x = make_input((1024, 7168), torch.bfloat16, 128, gen, special=True)
    stale = make_input((1024, 7168), torch.bfloat16, 128, gen, special=True)
    check_pdl_producer(quant_call(x, 128, layout, ue8m0), [x], [stale], ref_quant(x, 128, layout, ue8m0),
                       buffers_of(x, 128, layout))  # fmt: skip


@pytest.fixture
def fresh_dynamo():
    torch._dynamo.reset()
    yield
    torch._dynamo.reset()


@pytest.mark.parametrize("m", [5, 128])
@pytest.mark.parametrize(
    "layout,ue8m0",
    format_params((("row", False), ("mn", False), ("mn_tma", False), ("mn_tma", True), ("packed_ue8m0", True))),
)
def test_torch_compile(layout, ue8m0, m, gen, fresh_dynamo):
    """fullgraph Inductor: a pointwise op feeding the quantization; the compiled outputs equal
    the reference and keep the eager strides ((1, align(M, 4)) for mn_tma, int32 packed)."""
    x = make_input((m, 640), torch.bfloat16, 128, gen)

    def fn(x):
        return fp8quant.per_token_group_quant(x * 2, 128, scale_layout=layout, ue8m0=ue8m0)

    q_c, s_c = torch.compile(fn, fullgraph=True)(x)
    q_e, s_e = fn(x)
    spec = spec_of(x, 128, layout)
    assert s_c.dtype == s_e.dtype == spec.dtype
    assert s_c.stride() == s_e.stride() == spec.stride, (s_c.stride(), s_e.stride(), spec.stride)
    check_geometry(q_c, s_c, x, spec)
    ref_q, ref_s = ref_quant(x * 2, 128, layout, ue8m0)
    compare_outputs(q_c, s_c, ref_q, ref_s, spec, x, "compiled")
    compare_outputs(q_e, s_e, ref_q, ref_s, spec, x, "eager")


@pytest.mark.parametrize("layout", ["row", "mn"])
def test_torch_compile_out_variant(layout, gen, fresh_dynamo):
    """out= in compiled code (layouts without padding rows; padded ones are refused on purpose)."""
    x = make_input((129, 640), torch.bfloat16, 128, gen)

    def fn(x, q, s):
        return fp8quant.per_token_group_quant(x, 128, scale_layout=layout, out=(q, s))

    out = poisoned_outputs(x, 128, layout)
    q, s = out.outs
    torch.compile(fn, fullgraph=True)(x, q, s)
    ref_q, ref_s = ref_quant(x, 128, layout, False)
    compare_outputs(q, s, ref_q, ref_s, spec_of(x, 128, layout), x, "compiled out=")
    out.assert_nothing_written_outside()


@pytest.mark.parametrize("dynamic", [True, False, None], ids=["dynamic", "static", "automatic"])
@pytest.mark.parametrize("layout,ue8m0", format_params((("mn_tma", False), ("packed_ue8m0", True))))
def test_torch_compile_dynamic_modes(layout, ue8m0, dynamic, gen, fresh_dynamo):
    """Inductor with dynamic=True (symbolic M and eps), static shapes, and automatic dynamic
    shapes (a second M recompiles with a symbolic M), also under mark_dynamic."""

    def fn(x, eps):
        return fp8quant.per_token_group_quant(x * 2, 128, scale_layout=layout, ue8m0=ue8m0, eps=eps)

    compiled = torch.compile(fn, fullgraph=True, dynamic=dynamic)
    for m, eps in ((5, 1e-4), (130, 1e-10), (4097, 1e-4)):
        x = make_input((m, 640), torch.bfloat16, 128, gen)
        if dynamic is None and m == 4097:
            torch._dynamo.mark_dynamic(x, 0)
        q, s = compiled(x, eps)
        spec = spec_of(x, 128, layout)
        check_geometry(q, s, x, spec)
        ref_q, ref_s = ref_quant(x * 2, 128, layout, ue8m0, eps)
        compare_outputs(q, s, ref_q, ref_s, spec, x, f"compiled M={m}")


@pytest.mark.parametrize("m", [1, 5])  # 5: an mn_tma buffer with padding rows (a view of a larger one)
def test_eager_call_is_direct(m, gen):
    """What python -m fp8quant bench --host-overhead times, held by structure instead of by the
    clock (a timed bound flaked under load): an eager call on plain tensors runs no operator
    through torch's dispatcher but the allocation of its two outputs, and makes two CUDA
    allocations; with out=, none of either. The registered op, through the dispatcher, is the
    control."""
    x = make_input((m, 7168), torch.bfloat16, 128, gen)
    assert_direct_eager_call(lambda: quant(x, 128, "mn_tma", False), 2)
    q, s = quant(x, 128, "mn_tma", False)
    assert_direct_eager_call(lambda: quant(x, 128, "mn_tma", False, out=(q, s)), 0)
    with pytest.raises(AssertionError, match="went through the dispatcher"):
        assert_direct_eager_call(lambda: torch.ops.fp8quant.per_token_group_quant(x, 128, "mn_tma", False, 1e-10), 2)


# --------------------------------------------------------------------------------------------
# Consumer: torch._scaled_mm with the DeepSeek 1x128 / 128x128 recipe (SPEC 4)
# --------------------------------------------------------------------------------------------


def quantize_weight_blocks(w: torch.Tensor, block: int = 128, eps: float = 1e-4):
    """w [N, K] -> (fp8 [N, K], fp32 [N/block, K/block] contiguous), one scale per block."""
    n, k = w.shape
    wb = w.float().view(n // block, block, k // block, block)
    amax = wb.abs().amax(dim=(1, 3)).clamp_min(eps)
    s = (amax.double() / 448.0).float()
    q = (wb.double() / s.double()[:, None, :, None]).float().clamp(-448, 448).to(FP8)
    return q.view(n, k), s.contiguous()


def calc_diff(x: torch.Tensor, y: torch.Tensor) -> float:
    x, y = x.double(), y.double()
    return float(1 - 2 * (x * y).sum() / (x * x + y * y).sum())


@pytest.mark.parametrize(
    "layout,ue8m0,m",
    [("mn_tma", False, 256), ("mn_tma", True, 256), ("mn", False, 256), ("mn", False, 250), ("mn_tma", False, 250)],
    ids=["mn_tma-m256", "mn_tma-ue8m0-m256", "mn-m256", "mn-m250", "mn_tma-m250"],
)
def test_scaled_mm_consumer(layout, ue8m0, m, gen):
    n, k = 512, 1024
    row_mag = 10.0 ** (torch.rand((m, 1), generator=gen, device="cuda") * 2 - 1)
    x = (torch.randn((m, k), generator=gen, device="cuda") * row_mag).to(torch.bfloat16)
    w = torch.randn((n, k), generator=gen, device="cuda").to(torch.bfloat16)
    a_q, a_s = quant(x, 128, layout, ue8m0)
    ref_q, ref_s = ref_quant(x, 128, layout, ue8m0)
    compare_outputs(a_q, a_s, ref_q, ref_s, spec_of(x, 128, layout), x, "activations")
    w_q, w_s = quantize_weight_blocks(w)

    def mm(scale_a):
        return torch._scaled_mm(a_q, w_q.t(), scale_a=scale_a, scale_b=w_s.t(), out_dtype=torch.bfloat16)

    try:
        y = mm(a_s)
    except (RuntimeError, ValueError) as exc:
        # Only M not a multiple of 4 may be refused (torch 2.11 on the H200): torch's own check
        # wants the scales' column stride to be exactly M, which "mn_tma" pads to a multiple of
        # 4 rows (stride (1, 252) at M = 250), and cuBLASLt finds no algorithm for "mn"'s
        # stride of 250 floats (CUBLAS_STATUS_NOT_SUPPORTED); anything else fails
        if m % 4:
            pytest.skip(f"torch {torch.__version__} _scaled_mm refuses these scales ({layout}, M={m}): {exc}")
        raise
    expected = x.float() @ w.float().t()
    diff = calc_diff(y, expected)
    assert diff < 1e-3, f"calc_diff {diff:.3g}"
    # Control: the same scales moved to other rows (same layout) must be caught
    wrong = fp8quant.empty_scale(layout, m, k // 128, device="cuda")
    wrong.copy_(a_s.roll(1, dims=0))
    assert calc_diff(mm(wrong), expected) > 1e-2, "the consumer check cannot tell rows apart"


# --------------------------------------------------------------------------------------------
# Errors on the GPU path
# --------------------------------------------------------------------------------------------


def _other_device() -> str:
    return "cuda:1" if torch.cuda.device_count() > 1 else "cpu"


@pytest.mark.parametrize("which", ["q", "scale"])
def test_out_on_another_device_raises(which):
    x = torch.ones((8, 256), dtype=torch.bfloat16, device="cuda")
    q = torch.empty(x.shape, dtype=FP8, device="cuda")
    s = fp8quant.empty_scale("mn_tma", 8, 2, device="cuda")
    if which == "q":
        q = q.to(_other_device())
    else:
        s = fp8quant.empty_scale("mn_tma", 8, 2, device=_other_device())
    name = r"out\[0\] \(q\)" if which == "q" else r"out\[1\] \(scale\)"
    with pytest.raises(ValueError, match=name):
        quant(x, 128, "mn_tma", False, out=(q, s))


def _c_args(scale_layout="mn_tma", m=8, k=256, batch=None, **override):
    """Valid arguments of _C.per_token_group_quant (in order), with some replaced."""
    shape = (m, k) if batch is None else (batch, m, k)
    batch_shape = () if batch is None else (batch,)
    args = {
        "x": torch.ones(shape, dtype=torch.bfloat16, device="cuda"),
        "q": torch.empty(shape, dtype=torch.uint8, device="cuda"),
        "scale": fp8quant.empty_scale(scale_layout, m, k // 128, batch_shape, device="cuda"),
        "layout": LAYOUT_CODES[scale_layout],
        "ue8m0": scale_layout == "packed_ue8m0",
        "group_size": 128,
        "eps": 1e-10,
        "stream": torch.cuda.current_stream().cuda_stream,
    }
    args.update(override)
    return args


def _scale(layout, m, groups, device="cuda"):
    return fp8quant.empty_scale(layout, m, groups, device=device)


# case: (the argument the message must start with, a function making the bad arguments)
BAD_C_CALLS = {
    "scale_row_major_for_mn_tma": ("scale", lambda: _c_args(scale=_scale("row", 8, 2))),
    "scale_mn_strides_for_mn_tma": ("scale", lambda: _c_args(m=5, scale=_scale("mn", 5, 2))),
    "scale_batch_stride": (
        "scale",
        lambda: _c_args(batch=2, scale=torch.empty(40, device="cuda").as_strided((2, 8, 2), (20, 1, 8))),
    ),
    "scale_int32_for_mn_tma": ("scale", lambda: _c_args(scale=_scale("packed_ue8m0", 8, 2))),
    "scale_f32_for_packed": ("scale", lambda: _c_args("packed_ue8m0", scale=_scale("mn_tma", 8, 2))),
    "scale_on_cpu": ("scale", lambda: _c_args(scale=_scale("mn_tma", 8, 2, device="cpu"))),
    "q_bf16": ("q", lambda: _c_args(q=torch.empty((8, 256), dtype=torch.bfloat16, device="cuda"))),
    "q_int32": ("q", lambda: _c_args(q=torch.empty((8, 256), dtype=torch.int32, device="cuda"))),
    "q_shape": ("q", lambda: _c_args(q=torch.empty((8, 128), dtype=torch.uint8, device="cuda"))),
    "q_on_cpu": ("q", lambda: _c_args(q=torch.empty((8, 256), dtype=torch.uint8))),
    "layout_code": ("scale_layout", lambda: _c_args(layout=7)),
    "group_size": ("group_size", lambda: _c_args(group_size=16, scale=_scale("mn_tma", 8, 16))),
    "eps_zero": ("eps", lambda: _c_args(eps=0.0)),
    "packed_without_ue8m0": ("ue8m0", lambda: _c_args("packed_ue8m0", ue8m0=False)),
}


@pytest.mark.parametrize("case", list(BAD_C_CALLS))
def test_extension_errors_name_the_argument(case):
    """Direct calls of fp8quant._C.per_token_group_quant with one bad argument raise
    ValueError whose message starts with that argument's name; a valid call afterwards still
    works (no sticky CUDA error)."""
    arg, make_args = BAD_C_CALLS[case]
    with pytest.raises(ValueError, match=rf"^{arg}:"):
        _extension().per_token_group_quant(*make_args().values())
    x = make_input((8, 256), torch.bfloat16, 128, torch.Generator(device="cuda").manual_seed(3))
    check_quant(x, 128, "mn_tma", False)


@pytest.mark.skipif("torch.cuda.device_count() < 2")
def test_second_device():
    """x on cuda:1 while cuda:0 is current: the op runs on x's device."""
    gen = torch.Generator(device="cuda:1").manual_seed(1)
    x = torch.randn((129, 640), generator=gen, device="cuda:1").to(torch.bfloat16)
    with torch.cuda.device(0):
        q, s = quant(x, 128, "mn_tma", False)
    assert q.device == x.device and s.device == x.device
    torch.cuda.synchronize(1)
    ref_q, ref_s = ref_quant(x, 128, "mn_tma", False)
    compare_outputs(q, s, ref_q, ref_s, spec_of(x, 128, "mn_tma"), x, "cuda:1")
