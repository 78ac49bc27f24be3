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
    with pytest.raises(ValueError, match="out"):
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


def test_nvfp4_c_api_refusals():
    c = _c()
    good = dict(x=1 << 20, x_dtype=2, batch=1, m=4, k=64, x_batch_stride=0, x_row_stride=64, q=2 << 20,
                q_batch_stride=0, q_row_stride=32, scale=3 << 20, scale_layout=1, global_scale=4 << 20,
                per_batch=False, stream=0)  # fmt: skip
    for name, value in [("k", 40), ("global_scale", 0), ("q_row_stride", 31), ("scale_layout", 3)]:
        with pytest.raises(ValueError, match=rf"^{name}:"):
            c.nvfp4_quant_ptr(**(good | {name: value}))
