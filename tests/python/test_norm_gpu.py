"""GPU tests of fp8quant.rms_norm_quant and fp8quant.rms_norm: the kernels bit-identical to the
references run on the GPU (the fused op to the composition of the reference RMSNorm and the
quantizer), through the shared harness (poisoned out= buffers with guards), with and without a
residual (updated in place), every scale format, group sizes 32 to 128, M in {1, 3, 5, 127,
4097}, H in {128, 7168, 16384}, bf16 and fp16; streams, CUDA graphs, torch.compile, a PDL
producer that writes x, the weight and the residual late, and the eager call's structure. Marked
``gpu``."""

from __future__ import annotations

import pytest
import torch
from gpu_harness import (
    assert_bitwise_equal,
    assert_direct_eager_call,
    check_graph,
    check_op,
    check_pdl_producer,
    check_side_stream,
    pdl_setting,
)

import fp8quant
from fp8quant import reference as R
from fp8quant.norm import _add_norm, _add_norm_quant, _norm, _norm_quant

pytestmark = pytest.mark.gpu

FORMATS = [
    ("row", False), ("row", True), ("mn", False), ("mn", True), ("mn_tma", False), ("mn_tma", True),
    ("packed_ue8m0", True),
]  # fmt: skip
FORMAT_IDS = [f"{lay}{'+ue8m0' if u and lay != 'packed_ue8m0' else ''}" for lay, u in FORMATS]
EPS = 1e-6


def inputs(m: int, h: int, dtype: torch.dtype, gen, residual: bool):
    """x, weight and a residual (or None) of random values (never zeros), weights around 1."""
    x = (torch.randn(m, h, generator=gen, device="cuda") * 3).to(dtype)
    w = (1 + 0.5 * torch.randn(h, generator=gen, device="cuda")).to(dtype)
    res = (torch.randn(m, h, generator=gen, device="cuda") * 2).to(dtype) if residual else None
    return x, w, res


def check_fused(x, w, res0, layout, ue8m0, group_size=128):
    """rms_norm_quant against the reference (out= into poisoned buffers, then allocating), the
    residual reset before and checked after each call. Returns a call without the check (one
    that may be captured in a CUDA graph), the reference and the buffers."""
    params = (EPS, group_size, layout, ue8m0, 1e-10)
    ref = R.rms_norm_quant(x, w, EPS, residual=res0, group_size=group_size, scale_layout=layout, ue8m0=ue8m0)
    res = None if res0 is None else res0.clone()

    def call(out=None):
        if res is not None:
            res.copy_(res0)
        got = fp8quant.rms_norm_quant(x, w, EPS, residual=res, group_size=group_size, scale_layout=layout,
                                      ue8m0=ue8m0, out=out)  # fmt: skip
        assert res is None or got[2] is res
        return got[:2]

    def checked_call(out=None):
        got = call(out)
        if res is not None:
            assert_bitwise_equal(res, ref[2], "residual after the call")
        return got

    buffers = _norm_quant.buffers(x, w, *params) if res is None else _add_norm_quant.buffers(x, res, w, *params)
    check_op(checked_call, ref[:2], buffers)
    call.residual = res
    return call, ref, buffers


@pytest.mark.parametrize("residual", [False, True], ids=["plain", "residual"])
@pytest.mark.parametrize("layout,ue8m0", FORMATS, ids=FORMAT_IDS)
@pytest.mark.parametrize("m", [1, 3, 5, 127, 4097])
def test_rms_norm_quant_formats(m, layout, ue8m0, residual, gen):
    for h in (128, 7168, 16384):
        check_fused(*inputs(m, h, torch.bfloat16, gen, residual), layout, ue8m0)


@pytest.mark.parametrize("group_size", [32, 64, 128])
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16], ids=["bf16", "fp16"])
def test_rms_norm_quant_dtypes_and_groups(dtype, group_size, gen):
    for h in (128, 640, 16384):  # G odd and even
        for layout, ue8m0 in (("row", False), ("mn_tma", False), ("packed_ue8m0", True)):
            check_fused(*inputs(129, h, dtype, gen, True), layout, ue8m0, group_size)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16], ids=["bf16", "fp16"])
@pytest.mark.parametrize("m", [1, 3, 5, 127, 4097])
def test_rms_norm(m, dtype, gen):
    for h in (128, 7168, 16384):
        for residual in (False, True):
            x, w, res0 = inputs(m, h, dtype, gen, residual)
            ref = R.rms_norm(x, w, EPS, residual=res0)
            res = None if res0 is None else res0.clone()

            def call(out=None):
                if res is not None:
                    res.copy_(res0)
                got = fp8quant.rms_norm(x, w, EPS, residual=res, out=None if out is None else out[0])
                if res is None:
                    return (got,)
                assert_bitwise_equal(res, ref[1], "residual after the call")
                return (got[0],)

            buffers = _norm.buffers(x, w, EPS) if res is None else _add_norm.buffers(x, res, w, EPS)
            check_op(call, (ref,) if res is None else (ref[0],), buffers, x=x)


@pytest.mark.parametrize("m", [3, 129])
def test_strided_rows(m, gen):
    """x and the residual as row slices of wider tensors (row strides and starts 16-byte aligned,
    not the row's length), q with padded rows: the same bytes, and the residual's tensor is
    written only inside its rows."""
    h, fill = 1024, 7.0
    w = (1 + 0.5 * torch.randn(h, generator=gen, device="cuda")).to(torch.bfloat16)
    x = (torch.randn(m, h + 64, generator=gen, device="cuda") * 3).to(torch.bfloat16)[:, 32 : 32 + h]
    res0 = (torch.randn(m, h, generator=gen, device="cuda") * 2).to(torch.bfloat16)
    wide = torch.full((m, h + 128), fill, dtype=torch.bfloat16, device="cuda")
    res = wide[:, 64 : 64 + h]
    outside = torch.ones_like(wide, dtype=torch.bool)
    outside[:, 64 : 64 + h] = False

    def with_residual(op, *args, **kwargs):
        res.copy_(res0)
        got = op(x, w, EPS, *args, residual=res, **kwargs)
        assert bool((wide[outside] == fill).all()), "the residual's tensor was written outside its rows"
        return got

    for layout, ue8m0 in (("row", False), ("mn_tma", False), ("packed_ue8m0", True)):
        ref = R.rms_norm_quant(x, w, EPS, residual=res0, scale_layout=layout, ue8m0=ue8m0)

        def call(out=None, layout=layout, ue8m0=ue8m0, ref=ref):
            got = with_residual(fp8quant.rms_norm_quant, scale_layout=layout, ue8m0=ue8m0, out=out)
            assert_bitwise_equal(res, ref[2], "strided residual after the call")
            return got[:2]

        buffers = _add_norm_quant.buffers(x, res, w, EPS, 128, layout, ue8m0, 1e-10)
        check_op(call, ref[:2], buffers, x=x, out_kwargs={"row_pad": 32})
    ref = R.rms_norm(x, w, EPS, residual=res0)

    def call_norm(out=None):
        got = with_residual(fp8quant.rms_norm, out=None if out is None else out[0])
        assert_bitwise_equal(res, ref[1], "strided residual after the call")
        return (got[0],)

    check_op(call_norm, (ref[0],), _add_norm.buffers(x, res, w, EPS), x=x, out_kwargs={"row_pad": 32})


def test_fused_equals_the_unfused_pair_and_torch(gen):
    """The fused op writes the bytes of fp8quant.rms_norm followed by the quantizer, and the norm
    is within one rounding of its dtype of torch.nn.functional.rms_norm."""
    x, w, res0 = inputs(300, 7168, torch.bfloat16, gen, True)
    r1, r2 = res0.clone(), res0.clone()
    q, s, _ = fp8quant.rms_norm_quant(x, w, EPS, residual=r1, scale_layout="mn_tma")
    y, _ = fp8quant.rms_norm(x, w, EPS, residual=r2)
    q2, s2 = fp8quant.per_token_group_quant(y, 128, scale_layout="mn_tma")
    assert torch.equal(q.view(torch.uint8), q2.view(torch.uint8)) and torch.equal(s, s2) and torch.equal(r1, r2)
    torch_y = torch.nn.functional.rms_norm(r2, (7168,), w, EPS)
    ulp = torch.exp2(torch.floor(torch.log2(torch_y.float().abs().clamp(min=1e-30))) - 7)
    assert bool(((y.float() - torch_y.float()).abs() <= ulp).all())


def test_subnormal_squares_without_eps(gen):
    """bf16 values near 2^-72 have squares below float32's normal range, where a multiply and an
    add would round twice: the kernels' fused multiply-adds match the reference's emulation of
    them there too, and with eps = 0 those sums alone set r."""
    x = (torch.randn(64, 7168, generator=gen, device="cuda") * 2.0**-72).to(torch.bfloat16)
    w = (1 + 0.5 * torch.randn(7168, generator=gen, device="cuda")).to(torch.bfloat16)
    assert bool((R.sum_of_squares(x.float()) < 2.0**-126).all())  # the sums are subnormal too
    assert_bitwise_equal(fp8quant.rms_norm(x, w, 0.0), R.rms_norm(x, w, 0.0), "y")
    q, s = fp8quant.rms_norm_quant(x, w, 0.0, scale_layout="mn_tma")
    rq, rs = R.rms_norm_quant(x, w, 0.0, scale_layout="mn_tma")
    assert_bitwise_equal(q, rq, "q")
    assert_bitwise_equal(s, rs, "scale")


def test_empty_and_errors(gen):
    x, w, res = inputs(0, 256, torch.bfloat16, gen, True)
    q, s, r = fp8quant.rms_norm_quant(x, w, residual=res, scale_layout="mn_tma")
    assert q.shape == (0, 256) and s.shape == (0, 2)
    x, w, _ = inputs(4, 16400, torch.bfloat16, gen, False)
    with pytest.raises(ValueError, match=r"^h: must be a positive multiple of 16, at most 16384, got 16400$"):
        fp8quant.rms_norm(x, w)
    wide = torch.randn(4, 264, generator=gen, device="cuda").to(torch.bfloat16)
    with pytest.raises(ValueError, match=r"^x: must be 16-byte aligned$"):
        fp8quant.rms_norm(wide[:, 1:257], torch.ones(256, dtype=torch.bfloat16, device="cuda"))
    x, w, res = inputs(4, 256, torch.bfloat16, gen, True)
    with pytest.raises(ValueError, match=r"^residual: overlaps x$"):
        fp8quant.rms_norm(x, w, residual=x)


def test_stream_graph_compile(gen):
    x, w, res0 = inputs(300, 7168, torch.bfloat16, gen, True)
    call, ref, buffers = check_fused(x, w, res0, "packed_ue8m0", True)
    check_side_stream(call, ref[:2], buffers)
    check_side_stream(lambda out=None: (fp8quant.rms_norm(x, w, EPS, out=None if out is None else out[0]),),
                      (R.rms_norm(x, w, EPS),), _norm.buffers(x, w, EPS), x=x)  # fmt: skip
    for pdl in (True, False):
        with pdl_setting(pdl):
            check_graph(call, lambda: x.copy_(torch.randn(x.shape, generator=gen, device="cuda")),
                        lambda: R.rms_norm_quant(x, w, EPS, residual=res0, scale_layout="packed_ue8m0")[:2], buffers,
                        variant="out")  # fmt: skip
            assert_bitwise_equal(call.residual, R.rms_norm(x, w, EPS, residual=res0)[1], "residual after the replay")
    torch._dynamo.reset()
    fn = torch.compile(
        lambda x, w, r: fp8quant.rms_norm_quant(x * 2, w, EPS, residual=r, scale_layout="mn_tma"),
        fullgraph=True,
        dynamic=True,
    )
    res = res0.clone()
    q, s, _ = fn(x, w, res)
    rq, rs, rh = R.rms_norm_quant(x * 2, w, EPS, residual=res0, scale_layout="mn_tma")
    assert torch.equal(q.view(torch.uint8), rq.view(torch.uint8)) and torch.equal(s, rs) and torch.equal(res, rh)
    torch._dynamo.reset()


@pytest.mark.parametrize("residual", [False, True], ids=["plain", "residual"])
@pytest.mark.parametrize("fused", [False, True], ids=["rms_norm", "rms_norm_quant"])
def test_pdl_producer(fused, residual, gen):
    """Behind a producer that lets the op launch at once and writes x, the weight and the
    residual late, the op reads their final values and writes nothing before the producer is
    done (gpu_harness.check_pdl_producer); the residual is updated from its final value."""
    x, w, res = inputs(300, 7168, torch.bfloat16, gen, residual)
    stale = [t for t in inputs(300, 7168, torch.bfloat16, gen, residual) if t is not None]
    if fused:
        params = (EPS, 128, "mn_tma", False, 1e-10)
        ref = R.rms_norm_quant(x, w, EPS, residual=res, scale_layout="mn_tma")
        buffers = _norm_quant.buffers(x, w, *params) if res is None else _add_norm_quant.buffers(x, res, w, *params)

        def call(out=None):
            return fp8quant.rms_norm_quant(x, w, EPS, residual=res, scale_layout="mn_tma", out=out)[:2]

        refs, new_res = ref[:2], ref[2] if residual else None
    else:
        ref = R.rms_norm(x, w, EPS, residual=res)
        buffers = _norm.buffers(x, w, EPS) if res is None else _add_norm.buffers(x, res, w, EPS)

        def call(out=None):
            got = fp8quant.rms_norm(x, w, EPS, residual=res, out=None if out is None else out[0])
            return (got,) if res is None else (got[0],)

        refs, new_res = ((ref,), None) if res is None else ((ref[0],), ref[1])

    def after(label):
        if res is not None:
            assert_bitwise_equal(res, new_res, f"{label}: residual")

    check_pdl_producer(call, [t for t in (x, w, res) if t is not None], stale, refs, buffers, after=after)


def test_eager_call_is_direct(gen):
    """rms_norm_quant's eager call (a row of python -m fp8quant bench --host-overhead): no
    dispatcher round trip, its two outputs allocated and nothing else, none with out=."""
    x, w, res = inputs(1, 7168, torch.bfloat16, gen, True)
    assert_direct_eager_call(lambda: fp8quant.rms_norm_quant(x, w, EPS, residual=res, scale_layout="mn_tma"), 2)
    q, s, _ = fp8quant.rms_norm_quant(x, w, EPS, residual=res, scale_layout="mn_tma")
    assert_direct_eager_call(lambda: fp8quant.rms_norm_quant(x, w, EPS, residual=res, scale_layout="mn_tma",
                                                             out=(q, s)), 0)  # fmt: skip
