"""Argument checking of the public fp8quant.per_token_group_quant (exception type and a message
naming the argument), empty inputs, and the CPU path's bit-exact agreement with the reference."""

from __future__ import annotations

import math

import pytest
import torch
from handmath import full_buffer

import fp8quant
from fp8quant import empty_scale, per_token_group_quant, reference, scale_spec
from fp8quant._ext import _C

FP8 = torch.float8_e4m3fn
LAYOUTS = fp8quant.SCALE_LAYOUTS
LAYOUT_CODES = {"row": 0, "mn": 1, "mn_tma": 2, "packed_ue8m0": 3}


def randn(*shape, dtype=torch.bfloat16, seed=0) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    return torch.randn(shape, generator=g).to(dtype)


def good_out(x: torch.Tensor, layout: str = "row", group_size: int = 128):
    g = x.shape[-1] // group_size
    return torch.empty(x.shape, dtype=FP8), empty_scale(layout, x.shape[-2], g, tuple(x.shape[:-2]))


# --- x -----------------------------------------------------------------------------------------


@pytest.mark.parametrize("dtype", [torch.int32, torch.int8, torch.float64, torch.float8_e4m3fn, torch.bool])
def test_x_dtype(dtype):
    x = torch.ones(4, 128, dtype=dtype)
    with pytest.raises(TypeError, match=r"^x must be bfloat16, float16 or float32"):
        per_token_group_quant(x)


def test_x_not_a_tensor():
    with pytest.raises(TypeError, match=r"^x must be a torch\.Tensor"):
        per_token_group_quant([[1.0] * 128])


@pytest.mark.parametrize("shape", [(128,), (2, 2, 2, 128), ()])
def test_x_rank(shape):
    with pytest.raises(ValueError, match=r"^x must be 2-D \[M, K\] or 3-D"):
        per_token_group_quant(torch.ones(shape))


@pytest.mark.parametrize("k, group_size", [(0, 128), (100, 32), (192, 128), (96, 64), (16, 32)])
def test_k_not_a_multiple(k, group_size):
    with pytest.raises(
        ValueError, match=rf"x\.shape\[-1\] \(K={k}\) must be a positive multiple of group_size \({group_size}\)"
    ):
        per_token_group_quant(torch.ones(4, k), group_size)


def test_x_last_dim_not_contiguous():
    x = randn(4, 512)[:, ::2]
    assert x.shape == (4, 256) and x.stride() == (512, 2)
    with pytest.raises(ValueError, match=r"^x must have a contiguous last dimension"):
        per_token_group_quant(x)
    # A transposed input is refused too; a row-strided one is fine.
    with pytest.raises(ValueError, match="contiguous last dimension"):
        per_token_group_quant(randn(128, 4).t())
    q, _ = per_token_group_quant(randn(4, 512)[:, :256])
    assert q.shape == (4, 256)


def test_x_on_unsupported_device():
    with pytest.raises(ValueError, match=r"^x must be a CUDA or CPU tensor, got device meta"):
        per_token_group_quant(torch.empty(4, 128, device="meta"))


# --- group_size, eps, layout, ue8m0 ------------------------------------------------------------


@pytest.mark.parametrize("group_size", [0, 16, 96, 256, -128])
def test_group_size_value(group_size):
    with pytest.raises(ValueError, match=r"^group_size must be one of \(32, 64, 128\)"):
        per_token_group_quant(torch.ones(4, 768), group_size)


@pytest.mark.parametrize("group_size", [True, 128.0, "128", None])
def test_group_size_type(group_size):
    with pytest.raises(TypeError, match=r"^group_size must be an int"):
        per_token_group_quant(torch.ones(4, 256), group_size)


@pytest.mark.parametrize("eps", [0.0, -1e-4, math.nan, math.inf, -math.inf, 1e-39, 1e-45, 1e39, 10**40])
def test_eps_value(eps):
    with pytest.raises(ValueError, match=r"^eps must be a positive float32 number"):
        per_token_group_quant(torch.ones(4, 128), eps=eps)


@pytest.mark.parametrize("eps", ["1e-4", None, True, torch.tensor(1e-4)])
def test_eps_type(eps):
    with pytest.raises(TypeError, match=r"^eps must be a float"):
        per_token_group_quant(torch.ones(4, 128), eps=eps)


def test_eps_extremes_accepted():
    x = torch.zeros(1, 128)
    _, s = per_token_group_quant(x, eps=torch.finfo(torch.float32).smallest_normal)
    assert s.item() == (torch.tensor(2.0**-126, dtype=torch.float64) / 448).float().item()
    _, s = per_token_group_quant(x, eps=1)  # an int is a number too
    assert s.item() == (torch.tensor(1.0, dtype=torch.float64) / 448).float().item()


@pytest.mark.parametrize("layout", ["col", "ROW", "", "packed", None])
def test_bad_scale_layout(layout):
    with pytest.raises(ValueError, match=r"^scale_layout must be one of 'row', 'mn', 'mn_tma', 'packed_ue8m0'"):
        per_token_group_quant(torch.ones(4, 128), scale_layout=layout)


def test_packed_requires_ue8m0():
    with pytest.raises(ValueError, match=r"^ue8m0=False contradicts scale_layout='packed_ue8m0'"):
        per_token_group_quant(torch.ones(4, 128), scale_layout="packed_ue8m0", ue8m0=False)
    # None and True are the same thing for packed scales.
    x = randn(4, 256)
    _, a = per_token_group_quant(x, scale_layout="packed_ue8m0")
    _, b = per_token_group_quant(x, scale_layout="packed_ue8m0", ue8m0=True)
    assert torch.equal(a, b)


@pytest.mark.parametrize("bad", ["no", 1, 0.0])
def test_ue8m0_must_be_bool(bad):
    with pytest.raises(TypeError, match=r"^ue8m0 must be a bool or None"):
        per_token_group_quant(torch.ones(4, 128), scale_layout="row", ue8m0=bad)


def test_out_q_must_not_overlap():
    x = torch.ones(4, 128)
    q = torch.empty(128, dtype=torch.float8_e4m3fn).expand(4, 128)
    with pytest.raises(ValueError, match=r"^out\[0\] \(q\) must not overlap itself"):
        per_token_group_quant(x, out=(q, empty_scale("row", 4, 1)))


def test_out_must_not_overlap_x_or_each_other():
    buf = torch.zeros(4 * 128 * 4, dtype=torch.uint8)
    x = buf[: 4 * 128 * 2].view(torch.bfloat16).view(4, 128)
    q_on_x = buf[: 4 * 128].view(torch.float8_e4m3fn).view(4, 128)
    with pytest.raises(ValueError, match=r"^out\[0\] \(q\) overlaps x"):
        per_token_group_quant(x, out=(q_on_x, empty_scale("row", 4, 1)))
    q = buf[4 * 128 * 2 : 4 * 128 * 3].view(torch.float8_e4m3fn).view(4, 128)
    scale_on_q = buf[4 * 128 * 2 : 4 * 128 * 2 + 16].view(torch.float32).view(4, 1)
    with pytest.raises(ValueError, match=r"^out\[1\] \(scale\) overlaps out\[0\] \(q\)"):
        per_token_group_quant(x, out=(q, scale_on_q))


def test_ue8m0_default_is_off_for_fp32_layouts():
    x = torch.full((1, 128), 672.0)
    for layout in ("row", "mn", "mn_tma"):
        assert per_token_group_quant(x, scale_layout=layout)[1].item() == 1.5
        assert per_token_group_quant(x, scale_layout=layout, ue8m0=True)[1].item() == 2.0


# --- out= ----------------------------------------------------------------------------------------


@pytest.mark.parametrize("kind", ["tensor", "str", "list1", "tuple3"])
def test_out_not_a_pair(kind):
    x = randn(4, 256)
    q, s = good_out(x)
    out = {"tensor": q, "str": "qs", "list1": [q], "tuple3": (q, s, s)}[kind]
    with pytest.raises(TypeError, match=r"^out must be a \(q, scale\) pair of tensors"):
        per_token_group_quant(x, out=out)


def test_out_members_not_tensors():
    x = randn(4, 256)
    q, s = good_out(x)
    with pytest.raises(TypeError, match=r"^out\[0\] \(q\) must be a torch\.Tensor, got list"):
        per_token_group_quant(x, out=([0], s))
    with pytest.raises(TypeError, match=r"^out\[1\] \(scale\) must be a torch\.Tensor, got NoneType"):
        per_token_group_quant(x, out=(q, None))


@pytest.mark.parametrize("dtype", [torch.uint8, torch.int8, torch.float8_e5m2, torch.bfloat16])
def test_out_q_dtype(dtype):
    x = randn(4, 256)
    _, s = good_out(x)
    with pytest.raises(TypeError, match=r"^out\[0\] \(q\) must be torch\.float8_e4m3fn"):
        per_token_group_quant(x, out=(torch.empty(4, 256, dtype=dtype), s))


@pytest.mark.parametrize("shape", [(4, 128), (5, 256), (1, 4, 256), (1024,)])
def test_out_q_shape(shape):
    x = randn(4, 256)
    _, s = good_out(x)
    with pytest.raises(ValueError, match=r"^out\[0\] \(q\) must have shape \(4, 256\), got"):
        per_token_group_quant(x, out=(torch.empty(shape, dtype=FP8), s))


def test_out_q_last_dim_not_contiguous():
    x = randn(4, 256)
    _, s = good_out(x)
    q = torch.empty(4, 512, dtype=FP8)[:, ::2]
    with pytest.raises(ValueError, match=r"^out\[0\] \(q\) must have a contiguous last dimension"):
        per_token_group_quant(x, out=(q, s))


@pytest.mark.parametrize(
    "layout, dtype",
    [
        ("row", torch.int32),
        ("mn", torch.float64),
        ("mn_tma", torch.bfloat16),
        ("packed_ue8m0", torch.float32),
        ("packed_ue8m0", torch.uint8),
    ],
)
def test_out_scale_dtype(layout, dtype):
    x = randn(4, 1024)
    q, s = good_out(x, layout)
    bad = torch.zeros(s.shape, dtype=dtype).as_strided(s.shape, s.stride())
    with pytest.raises(
        TypeError, match=rf"^out\[1\] \(scale\) must be torch\.\w+ for scale_layout='{layout}', got {dtype}"
    ):
        per_token_group_quant(x, scale_layout=layout, out=(q, bad))


@pytest.mark.parametrize("layout", LAYOUTS)
def test_out_scale_shape(layout):
    x = randn(5, 1024)
    q, s = good_out(x, layout)
    for shape in [(5, s.shape[1] + 1), (4, s.shape[1]), (1, 5, s.shape[1]), (s.shape[1], 5)]:
        bad = torch.empty(shape, dtype=s.dtype)
        with pytest.raises(
            ValueError, match=rf"^out\[1\] \(scale\) must have shape {re_tuple(s.shape)} for scale_layout='{layout}'"
        ):
            per_token_group_quant(x, scale_layout=layout, out=(q, bad))


def re_tuple(t) -> str:
    return r"\(" + ", ".join(map(str, t)) + r"\)"


@pytest.mark.parametrize(
    "layout, wrong_stride",
    [("row", (1, 5)), ("mn", (8, 1)), ("mn", (1, 8)), ("mn_tma", (1, 5)), ("mn_tma", (8, 1)), ("packed_ue8m0", (1, 5))],
)
def test_out_scale_strides(layout, wrong_stride):
    x = randn(5, 1024)  # G = 8, P = 2
    q, s = good_out(x, layout)
    bad = torch.empty(1000, dtype=s.dtype).as_strided(s.shape, wrong_stride)
    with pytest.raises(
        ValueError, match=rf"^out\[1\] \(scale\) must have strides {re_tuple(s.stride())} for scale_layout='{layout}'"
    ):
        per_token_group_quant(x, scale_layout=layout, out=(q, bad))


def test_out_scale_batch_stride():
    x = randn(2, 5, 384)
    q, s = good_out(x, "mn_tma")
    assert s.stride() == (24, 1, 8)
    bad = torch.empty(100, dtype=torch.float32).as_strided((2, 5, 3), (15, 1, 8))
    with pytest.raises(ValueError, match=r"strides \(24, 1, 8\)"):
        per_token_group_quant(x, scale_layout="mn_tma", out=(q, bad))


@pytest.mark.parametrize("layout", ["mn_tma", "packed_ue8m0"])
def test_out_scale_under_allocated(layout):
    """torch.empty_strided((M, G), (1, align(M, 4))) lacks the last column's padding rows."""
    x = randn(5, 384)
    q, s = good_out(x, layout)
    bad = torch.empty_strided(s.shape, s.stride(), dtype=s.dtype)
    assert bad.untyped_storage().nbytes() < s.untyped_storage().nbytes()
    with pytest.raises(ValueError, match=r"^out\[1\] \(scale\) needs \d+ bytes of storage"):
        per_token_group_quant(x, scale_layout=layout, out=(q, bad))


def test_out_scale_storage_offset_counts():
    x = randn(5, 384)
    q, _ = good_out(x, "mn_tma")
    buf = torch.empty(24, dtype=torch.float32)
    shifted = buf.as_strided((5, 3), (1, 8), storage_offset=1)  # 1 + 24 > 24 elements
    with pytest.raises(ValueError, match=r"^out\[1\] \(scale\) needs 100 bytes of storage from its start"):
        per_token_group_quant(x, scale_layout="mn_tma", out=(q, shifted))
    ok = torch.empty(25, dtype=torch.float32).as_strided((5, 3), (1, 8), storage_offset=1)
    per_token_group_quant(x, scale_layout="mn_tma", out=(q, ok))
    assert torch.equal(ok, reference.per_token_group_quant(x, 128, scale_layout="mn_tma")[1])


def test_out_on_another_device():
    x = randn(4, 256)
    q, s = good_out(x)
    with pytest.raises(ValueError, match=r"^out\[0\] \(q\) is on meta, x on cpu"):
        per_token_group_quant(x, out=(q.to("meta"), s))
    with pytest.raises(ValueError, match=r"^out\[1\] \(scale\) is on meta, x on cpu"):
        per_token_group_quant(x, out=(q, s.to("meta")))


# --- empty input ---------------------------------------------------------------------------------


@pytest.mark.parametrize("layout", LAYOUTS)
@pytest.mark.parametrize("shape", [(0, 384), (0, 2, 384), (2, 0, 384)])
def test_empty_input(layout, shape):
    x = torch.empty(shape, dtype=torch.bfloat16)
    spec = scale_spec(layout, shape[-2], 3, tuple(shape[:-2]))
    for out in (None, good_out(x, layout)):
        q, s = per_token_group_quant(x, scale_layout=layout, out=out)
        assert q.dtype == FP8 and q.shape == shape
        assert s.dtype == spec.dtype
        assert tuple(s.shape) == spec.shape == (*shape[:-1], 1 if layout == "packed_ue8m0" else 3)
        assert s.stride() == spec.stride
        assert s.numel() == 0


def test_empty_input_strides_by_hand():
    x = torch.empty(0, 384)
    assert per_token_group_quant(x, scale_layout="row")[1].stride() == (3, 1)
    assert per_token_group_quant(x, scale_layout="mn")[1].stride() == (1, 0)
    assert per_token_group_quant(x, scale_layout="mn_tma")[1].stride() == (1, 0)
    assert per_token_group_quant(x, scale_layout="packed_ue8m0")[1].stride() == (1, 0)


# --- the CPU path equals the reference -------------------------------------------------------------


def assert_same(q, s, ref_q, ref_s):
    assert q.dtype == ref_q.dtype == FP8
    assert q.shape == ref_q.shape and q.stride() == ref_q.stride()
    assert torch.equal(q.view(torch.uint8), ref_q.view(torch.uint8))
    assert s.dtype == ref_s.dtype and s.shape == ref_s.shape and s.stride() == ref_s.stride()
    assert torch.equal(s, ref_s)
    assert s.untyped_storage().nbytes() == ref_s.untyped_storage().nbytes()
    assert torch.equal(full_buffer(s), full_buffer(ref_s))  # padding included


def special_input(shape, dtype, seed) -> torch.Tensor:
    """Random values of mixed magnitudes with an all-zero group, NaN, ±inf and -0.0 mixed in."""
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(shape, generator=g) * torch.logspace(-4, 3, shape[-2]).unsqueeze(-1)
    flat = x.view(-1, shape[-1])
    flat[0, :32] = 0.0
    flat[-1, 1] = math.nan
    flat[-1, 2] = math.inf
    flat[-1, 40] = -math.inf
    flat[-1, 3] = -0.0
    return x.to(dtype)


@pytest.mark.parametrize("layout", LAYOUTS)
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
@pytest.mark.parametrize("shape", [(5, 384), (2, 3, 384), (129, 128)])
@pytest.mark.parametrize("group_size", [32, 128])
def test_cpu_op_equals_reference(layout, dtype, shape, group_size):
    x = special_input(shape, dtype, seed=shape[-2])
    ue8m0_options = [None] if layout == "packed_ue8m0" else [False, True]
    for ue8m0 in ue8m0_options:
        for eps in (1e-10, 1e-4):
            kw = dict(scale_layout=layout, ue8m0=ue8m0, eps=eps)
            ref_q, ref_s = reference.per_token_group_quant(x, group_size, **kw)
            q, s = per_token_group_quant(x, group_size, **kw)
            assert_same(q, s, ref_q, ref_s)

            # out=: prefilled with garbage, which must all be overwritten (padding too)
            out_q, out_s = good_out(x, layout, group_size)
            out_q.view(torch.uint8).fill_(0x55)
            full_buffer(out_s).view(torch.int32).fill_(-1)
            q2, s2 = per_token_group_quant(x, group_size, out=(out_q, out_s), **kw)
            assert q2 is out_q and s2 is out_s
            assert_same(q2, s2, ref_q, ref_s)


def test_cpu_op_known_values():
    """A spot check that does not go through the reference: amax 448 -> scale 1 (byte 0x7F),
    zeros -> 2^-42 (0x55), amax 1 -> 1/448 in [2^-9, 2^-8) rounded up to 2^-8 (0x77)."""
    x = torch.ones(5, 384)
    x[:, 0] = 448.0
    x[:, 128:256] = 0.0
    q, s = per_token_group_quant(x, scale_layout="mn_tma", ue8m0=True)
    pad = [0.0] * 3
    assert full_buffer(s).tolist() == [1.0] * 5 + pad + [2.0**-42] * 5 + pad + [2.0**-8] * 5 + pad
    qb = q.view(torch.uint8)
    assert qb[:, :3].tolist() == [[0x7E, 0x38, 0x38]] * 5
    assert qb[:, 128:256].unique().tolist() == [0]
    assert qb[:, 256:].unique().tolist() == [0x78]  # 1 / 2^-8 = 256: e = 8 + 7 = 15, m = 0
    _, p = per_token_group_quant(x, scale_layout="packed_ue8m0")
    assert full_buffer(p).tolist() == [0x0077557F] * 5 + [0] * 3


def test_out_with_row_strided_q():
    """q may be a view with a padded row stride; only its last dimension must be contiguous."""
    x = randn(4, 256, dtype=torch.float32)
    big = torch.zeros(4, 384, dtype=FP8)
    q = big[:, :256]
    s = empty_scale("row", 4, 2)
    per_token_group_quant(x, out=(q, s))
    ref_q, ref_s = reference.per_token_group_quant(x, 128)
    assert torch.equal(q.view(torch.uint8), ref_q.view(torch.uint8))
    assert big.view(torch.uint8)[:, 256:].unique().tolist() == [0]  # untouched
    assert torch.equal(s, ref_s)


# --- the extension refuses CPU tensors --------------------------------------------------------


@pytest.mark.skipif(_C is None, reason="fp8quant._C is not built")
@pytest.mark.parametrize("layout", LAYOUTS)
def test_extension_rejects_cpu_tensors(layout):
    x = randn(4, 256, dtype=torch.float32)
    q = torch.empty(4, 256, dtype=torch.uint8)
    s = empty_scale(layout, 4, 2)
    with pytest.raises(ValueError, match=r"^x: must be a CUDA tensor$"):
        _C.per_token_group_quant(x, q, s, LAYOUT_CODES[layout], True, 128, 1e-10, 0)


@pytest.mark.skipif(_C is None, reason="fp8quant._C is not built")
@pytest.mark.parametrize(
    "layout, bad_shape, bad_stride, expected",
    [
        (
            "mn_tma",
            (5, 2),
            (2, 1),
            r"expected shape \(5, 2\) with strides \(1, 8\) for this layout, got shape \(5, 2\) with strides \(2, 1\)",
        ),
        (
            "mn",
            (5, 3),
            (1, 5),
            r"expected shape \(5, 2\) with strides \(1, 5\) for this layout, got shape \(5, 3\) with strides \(1, 5\)",
        ),
        (
            "packed_ue8m0",
            (5, 1),
            (2, 1),
            r"expected shape \(5, 1\) with strides \(1, 8\) for this layout, got shape \(5, 1\) with strides \(2, 1\)",
        ),
    ],
)
def test_extension_scale_message_says_what_it_expected(layout, bad_shape, bad_stride, expected):
    """The DLPack entry checks shapes before devices, and says what it wanted and what it got."""
    x = randn(5, 256)
    q = torch.empty(5, 256, dtype=torch.uint8)
    dtype = torch.int32 if layout == "packed_ue8m0" else torch.float32
    s = torch.empty(64, dtype=dtype).as_strided(bad_shape, bad_stride)
    with pytest.raises(ValueError, match=rf"^scale: {expected}$"):
        _C.per_token_group_quant(x, q, s, LAYOUT_CODES[layout], layout == "packed_ue8m0", 128, 1e-10, 0)


@pytest.mark.skipif(_C is None, reason="fp8quant._C is not built")
def test_extension_q_message_shows_both_shapes():
    x, q = randn(5, 256), torch.empty(5, 128, dtype=torch.uint8)
    with pytest.raises(
        ValueError, match=r"^q: must have the shape of x shape \(5, 256\) with strides \(256, 1\), got shape \(5, 128\)"
    ):
        _C.per_token_group_quant(x, q, empty_scale("row", 5, 2), 0, False, 128, 1e-10, 0)


@pytest.mark.skipif(_C is None, reason="fp8quant._C is not built")
@pytest.mark.parametrize("eps", [1e-45, 3e-43, 1e-39])
def test_extension_refuses_eps_below_the_normal_floats(eps):
    """The C API's rule (eps >= FLT_MIN), reached through the pointer entry without a GPU: the
    arguments are checked before any device is needed."""
    with pytest.raises(ValueError, match=r"^eps: must be finite and at least the smallest normal float32"):
        _C.per_token_group_quant_ptr(1 << 20, 2, 1, 4, 256, 0, 256, 2 << 20, 0, 256, 3 << 20, 2, False, 128, eps, 0)


@pytest.mark.skipif(_C is None, reason="fp8quant._C is not built")
def test_set_pdl():
    before = fp8quant.pdl_enabled()
    try:
        assert fp8quant.set_pdl(False) is before
        assert fp8quant.pdl_enabled() is False
        assert fp8quant.set_pdl(True) is False
        assert fp8quant.pdl_enabled() is True
        with pytest.raises(TypeError, match=r"^enabled must be a bool, got int$"):
            fp8quant.set_pdl(0)
    finally:
        fp8quant.set_pdl(before)
