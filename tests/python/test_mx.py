"""fp8quant.mxfp8_quant on the CPU (the reference path) and its argument checks: the op returns
the reference's bytes in both layouts and recipes, takes out= buffers of exactly its geometry,
refuses bad input naming the argument, registers with torch.library, and its C API refuses bad
arguments the same way without a GPU (fp8quant_mx_scale_bytes' geometry included). The CUDA
kernel's tests are in test_mx_gpu.py."""

from __future__ import annotations

import pytest
import torch

import fp8quant
from fp8quant import reference


def x_of(shape=(5, 96), dtype=torch.bfloat16, seed=0):
    return torch.randn(shape, generator=torch.Generator().manual_seed(seed)).to(dtype)


@pytest.mark.parametrize("layout", fp8quant.MX_SCALE_LAYOUTS)
@pytest.mark.parametrize("recipe", fp8quant.MX_RECIPES)
@pytest.mark.parametrize("shape", [(5, 96), (2, 3, 64)])
def test_cpu_is_the_reference(shape, recipe, layout):
    x = x_of(shape)
    q, s = fp8quant.mxfp8_quant(x, recipe=recipe, scale_layout=layout)
    q_ref, s_ref = reference.mxfp8_quant(x, recipe=recipe, scale_layout=layout)
    assert q.dtype == torch.float8_e4m3fn and s.dtype == torch.float8_e8m0fnu
    assert torch.equal(q.view(torch.uint8), q_ref.view(torch.uint8))
    assert torch.equal(s.view(torch.uint8), s_ref.view(torch.uint8))


def test_default_is_swizzled_rceil_and_out_is_used():
    x = x_of((130, 64))
    q, s = fp8quant.mxfp8_quant(x)
    assert s.shape == (256, 4)
    out = (torch.empty_like(q), torch.empty_like(s))
    got = fp8quant.mxfp8_quant(x, out=out)
    assert got[0] is out[0] and got[1] is out[1]
    assert torch.equal(out[1].view(torch.uint8), s.view(torch.uint8))
    message = r"^out\[1\] \(scale\) must have shape \(256, 4\) \(the whole scale buffer, contiguous\), got \(130, 2\)$"
    with pytest.raises(ValueError, match=message):
        fp8quant.mxfp8_quant(x, out=(torch.empty_like(q), torch.empty((130, 2), dtype=torch.float8_e8m0fnu)))


def test_dequant_round_trip():
    x = x_of((64, 256), torch.float32)
    back = fp8quant.mxfp8_dequant(*fp8quant.mxfp8_quant(x))
    assert ((back - x).norm() / x.norm()).item() < 0.05


@pytest.mark.parametrize(
    ("kwargs", "error", "match"),
    [
        (dict(x=torch.zeros(4, 31)), ValueError, r"K=31\) must be a positive multiple of 32"),
        (dict(x=torch.zeros(4, 64, dtype=torch.int32)), TypeError, "x must be bfloat16, float16 or float32"),
        (dict(x=torch.zeros(64)), ValueError, r"x must be 2-D \[M, K\] or 3-D \[B, M, K\]"),
        (dict(x=torch.zeros(64, 4).T), ValueError, "contiguous last dimension"),
        (dict(recipe="even"), ValueError, r"recipe must be one of \('rceil', 'floor'\)"),
        (dict(scale_layout="mn_tma"), ValueError, r"scale_layout must be one of \('row', 'swizzled'\)"),
    ],
)
def test_refusals_name_the_argument(kwargs, error, match):
    args = dict(x=x_of()) | kwargs
    with pytest.raises(error, match=match):
        fp8quant.mxfp8_quant(args.pop("x"), **args)


def test_registered_schema():
    assert str(torch.ops.fp8quant.mxfp8_quant.default._schema) == (
        "fp8quant::mxfp8_quant(Tensor x, str recipe, str scale_layout) -> (Tensor, Tensor)"
    )
    compiled = torch.compile(lambda x: fp8quant.mxfp8_quant(x), backend="eager", fullgraph=True)
    q, s = compiled(x_of())
    assert torch.equal(s.view(torch.uint8), fp8quant.mxfp8_quant(x_of())[1].view(torch.uint8))


# --- the C API without a GPU --------------------------------------------------------------------


def _c():
    from fp8quant._ext import extension  # noqa: PLC0415

    return extension()


def test_c_api_refusals():
    """Direct calls of the C entry with one bad argument: ValueError starting with its name
    (validation runs before any device is needed)."""
    c = _c()
    good = dict(x=1 << 20, x_dtype=2, batch=1, m=4, k=64, x_batch_stride=0, x_row_stride=64, q=2 << 20,
                q_batch_stride=0, q_row_stride=64, scale=3 << 20, scale_layout=1, recipe=0, stream=0)  # fmt: skip
    for name, value in [("k", 48), ("x_dtype", 9), ("scale_layout", 5), ("recipe", 7), ("batch", -1), ("m", -2),
                        ("q_row_stride", 32)]:  # fmt: skip
        with pytest.raises(ValueError, match=rf"^{name}:"):
            c.mxfp8_quant_ptr(**(good | {name: value}))


# --- NVFP4 ----------------------------------------------------------------------------------------


@pytest.mark.parametrize("layout", fp8quant.MX_SCALE_LAYOUTS)
@pytest.mark.parametrize("shape", [(5, 96), (3, 7, 64)])
def test_nvfp4_cpu_is_the_reference(shape, layout):
    x = x_of(shape, torch.float32)
    q, s, g = fp8quant.nvfp4_quant(x, scale_layout=layout)
    q_ref, s_ref, g_ref = reference.nvfp4_quant(x, scale_layout=layout)
    assert q.dtype == torch.uint8 and q.shape == (*shape[:-1], shape[-1] // 2) and s.dtype == torch.float8_e4m3fn
    assert torch.equal(q, q_ref) and torch.equal(s.view(torch.uint8), s_ref.view(torch.uint8)) and torch.equal(g, g_ref)
    back = fp8quant.nvfp4_dequant(q, s, g, scale_layout=layout)
    assert ((back - x).norm() / x.norm()).item() < 0.15


def test_nvfp4_per_expert_global_scale():
    x = x_of((3, 5, 32), torch.bfloat16) * torch.tensor([1.0, 10.0, 0.1]).view(3, 1, 1).to(torch.bfloat16)
    g = fp8quant.nvfp4_global_scale(x, per_batch=True)
    q, s, used = fp8quant.nvfp4_quant(x, g)
    assert used is g or torch.equal(used, g)
    for e in range(3):
        qe, se, _ = fp8quant.nvfp4_quant(x[e], g[e])
        assert torch.equal(q[e], qe) and torch.equal(s[e].view(torch.uint8), se.view(torch.uint8))


@pytest.mark.parametrize(
    ("args", "kwargs", "error", "match"),
    [
        ((torch.zeros(4, 24),), {}, ValueError, r"K=24\) must be a positive multiple of 16"),
        ((torch.zeros(4, 32), torch.tensor([1.0, 2.0])), {}, ValueError, r"global_scale must be a float32 tensor \[\]"),
        ((torch.zeros(4, 32), torch.tensor(1.0, dtype=torch.float64)), {}, ValueError, "global_scale must be"),
        ((torch.zeros(2, 4, 32), torch.ones(3)), {}, ValueError, r"\[\] or \[2\]"),
        ((torch.zeros(4, 32),), {"scale_layout": "mn"}, ValueError, "scale_layout must be one of"),
    ],
)
def test_nvfp4_refusals(args, kwargs, error, match):
    with pytest.raises(error, match=match):
        fp8quant.nvfp4_quant(*args, **kwargs)


@pytest.mark.parametrize(
    ("shape", "scale_shape", "per_batch"),
    [((0, 32), (0, 4), None), ((0, 5, 32), (0, 128, 4), (0,)), ((3, 0, 32), (3, 0, 4), (3,))],
)
def test_nvfp4_empty_input(shape, scale_shape, per_batch):
    """Empty x gives empty outputs (docs/contract.md, "Empty input"; the swizzled scales of 0 rows
    of 2 groups are 0 x 4 bytes, of 5 rows 128 x 4) and the encode scale of amax 0, which is 1 (as
    for an all-zero tensor), per batch too."""
    x = torch.randn(shape)
    q, s, g = fp8quant.nvfp4_quant(x)
    assert q.shape == (*shape[:-1], 16) and q.dtype == torch.uint8 and s.shape == scale_shape
    assert g.shape == () and g.item() == 1.0 == fp8quant.nvfp4_global_scale(torch.zeros(4, 32)).item()
    assert fp8quant.nvfp4_global_scale(x).item() == 1.0
    assert fp8quant.nvfp4_dequant(q, s, g).shape == shape
    if per_batch is not None:
        g = fp8quant.nvfp4_global_scale(x, per_batch=True)
        assert g.shape == per_batch and (g == 1).all()
        assert fp8quant.nvfp4_quant(x, g)[0].shape == q.shape


@pytest.mark.parametrize(
    ("args", "kwargs", "error", "match"),
    [
        (([1.0],), {}, TypeError, r"^x must be a torch.Tensor, got list$"),
        ((torch.ones(4, 32),), {"per_batch": True}, ValueError,
         r"^per_batch=True gives one scale per batch of a 3-D x \[B, M, K\], got shape \(4, 32\)$"),
        ((torch.ones(2, 4, 32),), {"per_batch": 1}, TypeError, r"^per_batch must be a bool, got int$"),
    ],
)  # fmt: skip
def test_nvfp4_global_scale_refusals(args, kwargs, error, match):
    """A list is not a tensor; per_batch=True is for a 3-D x (its docstring): on 2-D x it gave one
    scale per row."""
    with pytest.raises(error, match=match):
        fp8quant.nvfp4_global_scale(*args, **kwargs)


_MX = fp8quant.mxfp8_quant(x_of((5, 64)))  # q (5, 64), swizzled scales (128, 4)
_MX_ROW = fp8quant.mxfp8_quant(x_of((5, 64)), scale_layout="row")  # scales (5, 2)
_FP4 = fp8quant.nvfp4_quant(x_of((3, 5, 64)))  # q (3, 5, 32), swizzled scales (3, 128, 4), global scale []


@pytest.mark.parametrize(
    ("call", "error", "match"),
    [
        (lambda: fp8quant.mxfp8_dequant(*_MX_ROW, scale_layout="bogus"), ValueError,
         r"^scale_layout must be one of \('row', 'swizzled'\), got 'bogus'$"),
        (lambda: fp8quant.mxfp8_dequant(*_MX, scale_layout="row"), ValueError,
         r"^scale must have shape \(5, 2\) for q of shape \(5, 64\) and scale_layout='row', got \(128, 4\)$"),
        (lambda: fp8quant.mxfp8_dequant(_MX[0], _MX_ROW[1]), ValueError,
         r"^scale must have shape \(128, 4\) for q of shape \(5, 64\) and scale_layout='swizzled', got \(5, 2\)$"),
        (lambda: fp8quant.mxfp8_dequant(_MX[0].float(), _MX[1]), TypeError, r"^q must be torch.float8_e4m3fn, got torch.float32$"),
        (lambda: fp8quant.mxfp8_dequant(_MX[0][:, :48], _MX[1]), ValueError,
         r"^q must be \[\.\.\., M, K\] with K a multiple of 32, got shape \(5, 48\)$"),
        (lambda: fp8quant.mxfp8_dequant(_MX[0][0], _MX[1]), ValueError, r"^q must be \[\.\.\., M, K\]"),
        (lambda: fp8quant.mxfp8_dequant(_MX[0], _MX[1].view(torch.uint8)), TypeError,
         r"^scale must be torch.float8_e8m0fnu, got torch.uint8$"),
        (lambda: fp8quant.mxfp8_dequant(_MX[0], [1.0]), TypeError, r"^scale must be a torch.Tensor, got list$"),
        (lambda: fp8quant.nvfp4_dequant(*_FP4[:2], torch.ones(2)), ValueError,
         r"^global_scale must have shape \[\] or \[3\] for q of shape \(3, 5, 32\), got \[2\]$"),
        (lambda: fp8quant.nvfp4_dequant(_FP4[0][0], _FP4[1][0], torch.ones(3)), ValueError,
         r"^global_scale must have shape \[\] for q of shape \(5, 32\), got \[3\]$"),
        (lambda: fp8quant.nvfp4_dequant(*_FP4[:2], _FP4[2].double()), TypeError,
         r"^global_scale must be a float32 tensor, got torch.float64$"),
        (lambda: fp8quant.nvfp4_dequant(*_FP4[:2], 1.0), TypeError, r"^global_scale must be a float32 tensor, got float$"),
        (lambda: fp8quant.nvfp4_dequant(*_FP4, scale_layout="mn"), ValueError,
         r"^scale_layout must be one of \('row', 'swizzled'\), got 'mn'$"),
        (lambda: fp8quant.nvfp4_dequant(*_FP4, scale_layout="row"), ValueError,
         r"^scale must have shape \(3, 5, 4\) for q of shape \(3, 5, 32\) and scale_layout='row', got \(3, 128, 4\)$"),
        (lambda: fp8quant.nvfp4_dequant(_FP4[0].to(torch.int8), *_FP4[1:]), TypeError, r"^q must be torch.uint8, got torch.int8$"),
        (lambda: fp8quant.nvfp4_dequant(_FP4[0][..., :4], *_FP4[1:]), ValueError,
         r"^q must be \[\.\.\., M, K / 2\] with K a multiple of 16, got shape \(3, 5, 4\)$"),
        (lambda: fp8quant.nvfp4_dequant(_FP4[0], _FP4[1].view(torch.uint8), _FP4[2]), TypeError,
         r"^scale must be torch.float8_e4m3fn, got torch.uint8$"),
    ],
)  # fmt: skip
def test_dequant_refusals_name_the_argument(call, error, match):
    """The dequantizers check what they are given (an unknown scale_layout acted as "row", scales of
    another shape failed inside torch with its own message)."""
    with pytest.raises(error, match=match):
        call()


def test_nvfp4_c_api_refusals():
    c = _c()
    good = dict(x=1 << 20, x_dtype=2, batch=1, m=4, k=64, x_batch_stride=0, x_row_stride=64, q=2 << 20,
                q_batch_stride=0, q_row_stride=32, scale=3 << 20, scale_layout=1, global_scale=4 << 20,
                per_batch=False, stream=0)  # fmt: skip
    for name, value in [("k", 40), ("global_scale", 0), ("q_row_stride", 31), ("scale_layout", 3)]:
        with pytest.raises(ValueError, match=rf"^{name}:"):
            c.nvfp4_quant_ptr(**(good | {name: value}))
