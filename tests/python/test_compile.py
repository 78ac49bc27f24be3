"""torch.compile and fake-tensor support on CPU: the fake (meta) implementation must report the
real scale strides (e.g. (1, align(M, 4)) for mn_tma), or a compiler may assume (1, M)."""

from __future__ import annotations

import pytest
import torch
from handmath import full_buffer
from torch._subclasses.fake_tensor import FakeTensorMode

import fp8quant
from fp8quant import empty_scale, per_token_group_quant, reference

LAYOUTS = fp8quant.SCALE_LAYOUTS
FP8 = torch.float8_e4m3fn

# (layout, scale dtype, scale shape, scale strides) for x [5, 384], groups of 128: M=5, Ma=8, G=3
EXPECTED_2D = [
    ("row", torch.float32, (5, 3), (3, 1)),
    ("mn", torch.float32, (5, 3), (1, 5)),
    ("mn_tma", torch.float32, (5, 3), (1, 8)),
    ("packed_ue8m0", torch.int32, (5, 1), (1, 8)),
]


def randn(*shape, seed=0) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    return torch.randn(shape, generator=g).to(torch.bfloat16)


@pytest.fixture(autouse=True)
def _fresh_dynamo():
    torch._dynamo.reset()
    yield
    torch._dynamo.reset()


def assert_equal_outputs(q, s, ref_q, ref_s):
    assert q.dtype == FP8 and q.shape == ref_q.shape and q.stride() == ref_q.stride()
    assert torch.equal(q.view(torch.uint8), ref_q.view(torch.uint8))
    assert s.dtype == ref_s.dtype and s.shape == ref_s.shape and s.stride() == ref_s.stride()
    assert torch.equal(s, ref_s)


# --- the fake implementation -----------------------------------------------------------------


@pytest.mark.parametrize("layout, dtype, shape, stride", EXPECTED_2D)
def test_fake_impl_reports_real_strides(layout, dtype, shape, stride):
    with FakeTensorMode():
        x = torch.empty(5, 384, dtype=torch.bfloat16)
        q, s = torch.ops.fp8quant.per_token_group_quant(x, 128, layout, layout == "packed_ue8m0", 1e-10)
        assert q.dtype == FP8 and q.shape == (5, 384) and q.stride() == (384, 1)
        assert s.dtype == dtype and tuple(s.shape) == shape and s.stride() == stride
        rows = 5 if layout in ("row", "mn") else 8
        assert s.untyped_storage().nbytes() == rows * shape[1] * 4  # padding rows allocated


# test_schema is left out: torch's SchemaCheckMode multiplies outputs, which CPU float8 lacks
# ("mul_cpu_reduced_float" not implemented for 'Float8_e4m3fn').
OPCHECK_UTILS = ("test_faketensor", "test_autograd_registration", "test_aot_dispatch_dynamic")


@pytest.mark.parametrize("layout", LAYOUTS)
def test_opcheck(layout):
    """torch.library.opcheck: the fake impl (shapes, strides) and the real impl agree."""
    x = randn(5, 384)
    args = (x, 128, layout, layout == "packed_ue8m0", 1e-10)
    torch.library.opcheck(torch.ops.fp8quant.per_token_group_quant.default, args, test_utils=OPCHECK_UTILS)


@pytest.mark.parametrize("layout", LAYOUTS)
def test_opcheck_out(layout):
    x = randn(5, 384)
    q, s = torch.empty(5, 384, dtype=FP8), empty_scale(layout, 5, 3)
    args = (x, q, s, 128, layout, layout == "packed_ue8m0", 1e-10)
    torch.library.opcheck(torch.ops.fp8quant.per_token_group_quant_out.default, args, test_utils=OPCHECK_UTILS)


# --- torch.compile of the functional op ---------------------------------------------------------


@pytest.mark.parametrize("layout, dtype, shape, stride", EXPECTED_2D)
def test_compiled_matches_eager_and_reference(layout, dtype, shape, stride):
    def fn(x):
        q, s = per_token_group_quant(x, 128, scale_layout=layout)
        return q, s, s.stride()  # the stride seen while tracing, i.e. the fake impl's

    x = randn(5, 384, seed=1)
    q, s, traced_stride = torch.compile(fn, fullgraph=True, backend="aot_eager")(x)
    eq, es, _ = fn(x)
    ref_q, ref_s = reference.per_token_group_quant(x, 128, scale_layout=layout)
    assert tuple(traced_stride) == stride
    assert s.dtype == dtype and tuple(s.shape) == shape and s.stride() == stride
    assert_equal_outputs(q, s, eq, es)
    assert_equal_outputs(q, s, ref_q, ref_s)
    assert torch.equal(full_buffer(s), full_buffer(ref_s))


@pytest.mark.parametrize("layout", ["mn_tma", "packed_ue8m0"])
def test_compiled_3d(layout):
    def fn(x):
        return per_token_group_quant(x, 128, scale_layout=layout, eps=1e-4)

    x = randn(2, 5, 640, seed=2)  # G = 5, P = 2
    q, s = torch.compile(fn, fullgraph=True, backend="aot_eager")(x)
    ref_q, ref_s = reference.per_token_group_quant(x, 128, scale_layout=layout, eps=1e-4)
    cols = 5 if layout == "mn_tma" else 2
    assert s.stride() == (8 * cols, 1, 8)
    assert_equal_outputs(q, s, ref_q, ref_s)


# --- torch.compile of the out= variant -----------------------------------------------------------


def _run_out_variant(layout: str, fn, fullgraph: bool):
    """Compile fn(x, q, scale) and check that it filled q and scale."""
    x = randn(5, 384, seed=3)
    q = torch.empty(5, 384, dtype=FP8)
    s = empty_scale(layout, 5, 3)
    full_buffer(s).view(torch.int32).fill_(-1)  # garbage the op must overwrite, padding too
    total = torch.compile(fn, fullgraph=fullgraph, backend="aot_eager")(x, q, s)
    ref_q, ref_s = reference.per_token_group_quant(x, 128, scale_layout=layout)
    assert_equal_outputs(q, s, ref_q, ref_s)
    assert torch.equal(full_buffer(s), full_buffer(ref_s))
    assert torch.equal(total, ref_q.view(torch.uint8).float().sum() + full_buffer(ref_s).float().sum())


@pytest.mark.parametrize("layout", ["row", "mn"])
def test_compiled_out_op(layout):
    """The registered out= op traces in one graph and mutates q and scale in place."""

    def fn(x, q, s):
        torch.ops.fp8quant.per_token_group_quant_out(x, q, s, 128, layout, False, 1e-10)
        return q.view(torch.uint8).float().sum() + s.float().sum()

    _run_out_variant(layout, fn, fullgraph=True)


@pytest.mark.parametrize("layout", ["mn_tma", "packed_ue8m0"])
def test_compiled_out_op_padded_layout_fills_visible_scales(layout):
    """Compiled, the op gets a compact clone of a padded scale: the visible scales still come
    back right (padding is the caller's to keep, which is why the public API refuses this)."""

    def fn(x, q, s):
        torch.ops.fp8quant.per_token_group_quant_out(x, q, s, 128, layout, layout == "packed_ue8m0", 1e-10)

    x, q, s = randn(5, 384, seed=4), torch.empty(5, 384, dtype=FP8), empty_scale(layout, 5, 3)
    torch.compile(fn, fullgraph=True, backend="aot_eager")(x, q, s)
    ref_q, ref_s = reference.per_token_group_quant(x, 128, scale_layout=layout)
    assert_equal_outputs(q, s, ref_q, ref_s)
    assert torch.equal(s.view(torch.int32), ref_s.view(torch.int32))


def _public_out(layout):
    def fn(x, q, s):
        q2, s2 = per_token_group_quant(x, 128, scale_layout=layout, out=(q, s))
        return q2.view(torch.uint8).float().sum() + s2.float().sum()

    return fn


@pytest.mark.parametrize("fullgraph", [False, True])
@pytest.mark.parametrize("layout", ["row", "mn"])
def test_compiled_public_out(layout, fullgraph):
    _run_out_variant(layout, _public_out(layout), fullgraph=fullgraph)


@pytest.mark.parametrize("layout", ["mn_tma", "packed_ue8m0"])
def test_compiled_public_out_padded_layout_is_refused(layout):
    """torch.compile would clone the caller's scale without its padding rows: refused clearly."""
    x, q, s = randn(5, 384), torch.empty(5, 384, dtype=FP8), empty_scale(layout, 5, 3)
    with pytest.raises(Exception, match="cannot be compiled"):
        torch.compile(_public_out(layout), fullgraph=True, backend="aot_eager")(x, q, s)


@pytest.mark.parametrize("dynamic", [True, None])
@pytest.mark.parametrize("layout", ["mn_tma", "packed_ue8m0"])
def test_compiled_dynamic_shapes(layout, dynamic):
    """dynamic=True (eps a symbolic float, M symbolic) and automatic dynamic shapes (a second M
    recompiles with a symbolic M): the checks trace, the strides stay the layout's."""

    def fn(x, eps):
        return per_token_group_quant(x, 128, scale_layout=layout, eps=eps)

    compiled = torch.compile(fn, fullgraph=True, backend="aot_eager", dynamic=dynamic)
    for m, eps in ((5, 1e-4), (6, 1e-10), (9, 1e-4)):
        x = randn(m, 384, seed=m)
        q, s = compiled(x, eps)
        ref_q, ref_s = reference.per_token_group_quant(x, 128, scale_layout=layout, eps=eps)
        assert_equal_outputs(q, s, ref_q, ref_s)
        assert torch.equal(full_buffer(s), full_buffer(ref_s))
