"""The fused producers of Blackwell's formats without a GPU (issue 28): RMSNorm (+ residual) and
SiLU-and-mul (plain, contiguous and masked MoE layouts) quantized to MXFP8 and NVFP4.

The references are compositions of ops tested on their own (rms_norm, silu_and_mul, mxfp8_quant,
nvfp4_quant: test_mx_reference.py, test_nvfp4_reference.py, against torchao); here: the
composition itself, the MoE rows (padding rows zero, the per-expert encode scales), the CPU path
being the reference, the registered schemas, and the refusals, in Python and in the C API."""

from __future__ import annotations

import pytest
import torch

import fp8quant
from fp8quant import reference


def randn(*shape, dtype=torch.bfloat16, seed=0) -> torch.Tensor:
    """Gaussian data whose groups span many magnitudes (never zeros)."""
    gen = torch.Generator().manual_seed(seed)
    x = torch.randn(shape, generator=gen)
    spread = torch.exp2(torch.randint(-6, 6, (*shape[:-1], shape[-1] // 16, 1), generator=gen).float())
    return (x * spread.repeat_interleave(16, -1).view(shape)).to(dtype)


def same(a: torch.Tensor, b: torch.Tensor) -> bool:
    return a.dtype == b.dtype and a.shape == b.shape and torch.equal(a.view(torch.uint8), b.view(torch.uint8))


# --- RMSNorm -> MXFP8 / NVFP4 --------------------------------------------------------------------


@pytest.mark.parametrize("layout", fp8quant.MX_SCALE_LAYOUTS)
@pytest.mark.parametrize("recipe", fp8quant.MX_RECIPES)
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_rms_norm_mxfp8_is_norm_then_quant(dtype, recipe, layout):
    x, w = randn(5, 96, dtype=dtype), randn(96, dtype=dtype, seed=1)
    y = reference.rms_norm(x, w, 1e-5)
    want = reference.mxfp8_quant(y, recipe=recipe, scale_layout=layout)
    got = fp8quant.rms_norm_mxfp8(x, w, 1e-5, recipe=recipe, scale_layout=layout)
    assert all(same(g, r) for g, r in zip(got, want, strict=True))


@pytest.mark.parametrize("layout", fp8quant.MX_SCALE_LAYOUTS)
def test_rms_norm_nvfp4_is_norm_then_quant(layout):
    x, w = randn(7, 80), randn(80, seed=1)
    g = torch.tensor(448 * 6 / 3.0)
    want = reference.nvfp4_quant(reference.rms_norm(x, w, 1e-6), g, scale_layout=layout)[:2]
    got = fp8quant.rms_norm_nvfp4(x, w, g, scale_layout=layout)
    assert all(same(a, b) for a, b in zip(got, want, strict=True))


@pytest.mark.parametrize("fmt", ["mxfp8", "nvfp4"])
def test_rms_norm_block_scaled_with_residual(fmt):
    x, w, r = randn(4, 64), randn(64, seed=1), randn(4, 64, seed=2)
    h = (x.float() + r.float()).to(x.dtype)
    residual = r.clone()
    if fmt == "mxfp8":
        q, s, out = fp8quant.rms_norm_mxfp8(x, w, residual=residual)
        want = fp8quant.rms_norm_mxfp8(h, w)
    else:
        g = torch.tensor(100.0)
        q, s, out = fp8quant.rms_norm_nvfp4(x, w, g, residual=residual)
        want = fp8quant.rms_norm_nvfp4(h, w, g)
    assert out is residual and torch.equal(residual, h)  # updated in place, as rms_norm does
    assert same(q, want[0]) and same(s, want[1])


def test_rms_norm_block_scaled_outputs_and_out():
    x, w = randn(130, 64), randn(64, seed=1)
    q, s = fp8quant.rms_norm_mxfp8(x, w)
    assert q.shape == (130, 64) and q.dtype == torch.float8_e4m3fn
    assert s.shape == (256, 4) and s.dtype == torch.float8_e8m0fnu and s.is_contiguous()  # swizzled, padded
    q4, s4 = fp8quant.rms_norm_nvfp4(x, w, torch.tensor(50.0), scale_layout="row")
    assert (
        q4.shape == (130, 32) and q4.dtype == torch.uint8 and s4.shape == (130, 4) and s4.dtype == torch.float8_e4m3fn
    )
    out = (torch.empty_like(q), torch.empty_like(s))
    got = fp8quant.rms_norm_mxfp8(x, w, out=out)
    assert got[0] is out[0] and got[1] is out[1] and same(out[0], q) and same(out[1], s)


@pytest.mark.parametrize(
    ("call", "error", "match"),
    [
        (lambda x, w: fp8quant.rms_norm_mxfp8(x[:, :48], w[:48]), ValueError, r"H=48\) must be a multiple of 32"),
        (lambda x, w: fp8quant.rms_norm_mxfp8(x, w, recipe="even"), ValueError, "recipe must be one of"),
        (lambda x, w: fp8quant.rms_norm_mxfp8(x, w, scale_layout="mn"), ValueError, "scale_layout must be one of"),
        (lambda x, w: fp8quant.rms_norm_nvfp4(x, w, torch.ones(2)), ValueError, r"global_scale must be a float32 tensor \[\]"),
        (lambda x, w: fp8quant.rms_norm_nvfp4(x, w, 1.0), ValueError, "global_scale must be"),
        (lambda x, w: fp8quant.rms_norm_nvfp4(x.float(), w.float(), torch.tensor(1.0)), TypeError,
         r"^x must be a bfloat16 or float16 tensor \[M, H\]$"),
    ],
)  # fmt: skip
def test_rms_norm_block_scaled_refusals(call, error, match):
    with pytest.raises(error, match=match):
        call(randn(4, 64), randn(64, seed=1))


# --- SiLU-and-mul -> MXFP8 / NVFP4 ---------------------------------------------------------------


def routed(seed: int = 0):
    """A contiguous MoE layout of 4 experts with padding rows, its x (NaN in the padding rows,
    which must not be read) and a masked layout of the same experts."""
    gen = torch.Generator().manual_seed(seed)
    ids = torch.randint(-1, 4, (40, 2), generator=gen, dtype=torch.int32)
    routing = reference.moe_routing(ids, 4, align=16, max_m_sum=40 * 2 + 4 * 15 + 16)
    x = randn(routing.m_indices.numel(), 128, seed=seed)
    x[routing.m_indices < 0] = float("nan")
    masked_m = torch.tensor([0, 9, 3, 12], dtype=torch.int32)
    xm = randn(4, 12, 128, seed=seed + 1)
    xm[torch.arange(12) >= masked_m.unsqueeze(1)] = float("nan")
    return routing, x, masked_m, xm


@pytest.mark.parametrize("layout", fp8quant.MX_SCALE_LAYOUTS)
@pytest.mark.parametrize("recipe", fp8quant.MX_RECIPES)
def test_silu_mul_mxfp8_is_silu_then_quant(recipe, layout):
    x = randn(9, 192, dtype=torch.float16)
    want = reference.mxfp8_quant(reference.silu_and_mul(x), recipe=recipe, scale_layout=layout)
    got = fp8quant.silu_mul_mxfp8(x, recipe=recipe, scale_layout=layout)
    assert all(same(a, b) for a, b in zip(got, want, strict=True))


@pytest.mark.parametrize("fmt", ["mxfp8", "nvfp4"])
def test_silu_mul_block_scaled_moe_rows(fmt):
    """Padding rows come out zero (data and scale bytes) whatever x holds there; live rows are the
    plain op's bytes of those rows."""
    routing, x, masked_m, xm = routed()
    g = torch.tensor(300.0)
    op = (lambda x, **kw: fp8quant.silu_mul_mxfp8(x, scale_layout="row", **kw)) if fmt == "mxfp8" else (
        lambda x, **kw: fp8quant.silu_mul_nvfp4(x, g, scale_layout="row", **kw))  # fmt: skip
    live = routing.m_indices >= 0
    q, s = op(x, m_indices=routing.m_indices, row_offsets=routing.row_offsets)
    q_live, s_live = op(x[live])
    assert same(q[live], q_live) and same(s[live], s_live)
    assert not q[~live].view(torch.uint8).any() and not s[~live].view(torch.uint8).any()
    qm, sm = op(xm, masked_m=masked_m)
    for e, count in enumerate(masked_m.tolist()):
        if count:
            q_e, s_e = op(xm[e, :count])
            assert same(qm[e, :count], q_e) and same(sm[e, :count], s_e)
        assert not qm[e, count:].view(torch.uint8).any() and not sm[e, count:].view(torch.uint8).any()


def test_silu_mul_nvfp4_per_expert_global_scale():
    """The contiguous layout's rows take their expert's encode scale; the masked layout's batches
    theirs. Padding rows are zero, q and scale bytes: m_indices -1, and the rows past each
    expert's count (all of expert 0's, which has none)."""
    routing, x, masked_m, xm = routed(1)
    g = torch.tensor([40.0, 300.0, 7.0, 1000.0])
    q, s = fp8quant.silu_mul_nvfp4(x, g, scale_layout="row", m_indices=routing.m_indices)
    for e in range(4):
        rows = routing.m_indices == e
        q_e, s_e = fp8quant.silu_mul_nvfp4(x[rows], g[e], scale_layout="row")
        assert same(q[rows], q_e) and same(s[rows], s_e)
    assert not q[routing.m_indices < 0].any() and not s[routing.m_indices < 0].view(torch.uint8).any()
    qm, sm = fp8quant.silu_mul_nvfp4(xm, g, scale_layout="row", masked_m=masked_m)
    assert masked_m.tolist() == [0, 9, 3, 12]  # expert 0 has no row, expert 3 every row
    for e, count in enumerate(masked_m.tolist()):
        if count:
            q_e, s_e = fp8quant.silu_mul_nvfp4(xm[e, :count], g[e], scale_layout="row")
            assert same(qm[e, :count], q_e) and same(sm[e, :count], s_e)
        assert not qm[e, count:].any() and not sm[e, count:].view(torch.uint8).any()


def test_silu_mul_nvfp4_clamps_the_expert_index():
    """A row's expert is clamped into the encode scales given, as the kernel's encode_scale
    clamps it (docs/contract.md, "NVFP4"): an id past them reads the last scale, a negative one
    (padding) the first, never past the buffer. Expert 3 of two scales: every row takes g[1]."""
    x = randn(4, 32, dtype=torch.float32)
    g = torch.tensor([7.0, 300.0])
    want = fp8quant.silu_mul_nvfp4(x, g[1], scale_layout="row")
    for fn in (fp8quant.silu_mul_nvfp4, reference.silu_mul_nvfp4):
        got = fn(x, g, scale_layout="row", m_indices=torch.full((4,), 3, dtype=torch.int32))
        assert all(same(a, b) for a, b in zip(got, want, strict=True))
    # the dispatch's rows the same way (a routing whose m_indices disagree with the scales given)
    slot_rows = torch.tensor([[0], [1]], dtype=torch.int32)
    got = reference.moe_scatter_nvfp4(x[:2, :16], slot_rows, (2,), g, row_experts=torch.tensor([5, -1]),
                                      scale_layout="row")  # fmt: skip
    for row, e in ((0, 1), (1, 0)):
        q_e, s_e = fp8quant.nvfp4_quant(x[row : row + 1, :16], g[e], scale_layout="row")[:2]
        assert same(got[0][row : row + 1], q_e) and same(got[1][row : row + 1], s_e)


def test_rms_norm_block_scaled_hand_values():
    """test_norm.py's hand row at H = 32: h = x + residual = [3, 4, 0, ...], mean square 25 / 32,
    r = sqrt(32) / 5 = 1.1313708; h * r = 3.3941125, 4.5254834, rounded to bf16 (steps 2^-6 and
    2^-5: 217.22 * 2^-6 -> 3.390625, 144.82 * 2^-5 -> 4.53125), times the weight 2:
    y = [6.78125, 9.0625, 0, ...].

    MXFP8 (rceil, one group of 32): amax / 448 = 0.0202288, the next power of two 2^-5: byte
    127 - 5 = 122. y * 2^5 = 217 -> e4m3 224 (1.75 * 2^7, step 16 there: 208 | 224) = 0x76;
    290 -> 288 (1.125 * 2^8, step 32) = 0x79; the zeros 0x00.

    NVFP4 (encode scale 1, groups of 16): group 0's s = e4m3(9.0625 / 6 = 1.5104) = 1.5 (step
    0.125); S / s = 0.6666667; 6.78125 * 0.6666667 = 4.52 -> e2m1 4 (code 6), 9.0625 * 0.6666667
    = 6.04 -> 6 (code 7): byte 0x76 (element 0 low). Group 1 is all zero: scale 0, bytes 0."""
    x = torch.zeros(1, 32, dtype=torch.bfloat16)
    x[0, 0], x[0, 1] = 1.0, 4.0
    res = torch.zeros(1, 32, dtype=torch.bfloat16)
    res[0, 0] = 2.0
    w = torch.full((32,), 2.0, dtype=torch.bfloat16)
    assert reference.rms_norm(x, w, 0.0, residual=res)[0][0, :2].tolist() == [6.78125, 9.0625]
    q_bytes = [0x76, 0x79] + [0] * 30
    for fn in (fp8quant.rms_norm_mxfp8, reference.rms_norm_mxfp8):
        q, s, h = fn(x, w, 0.0, residual=res.clone(), recipe="rceil", scale_layout="row")
        assert s.view(torch.uint8).tolist() == [[122]] and q.view(torch.uint8).tolist() == [q_bytes]
    for fn in (fp8quant.rms_norm_nvfp4, reference.rms_norm_nvfp4):
        q, s, h = fn(x, w, torch.tensor(1.0), 0.0, residual=res.clone(), scale_layout="row")
        assert s.float().tolist() == [[1.5, 0.0]] and q.tolist() == [[0x76] + [0] * 15]


def test_silu_mul_block_scaled_swizzled_shapes():
    x = randn(3, 5, 2 * 80)
    q, s = fp8quant.silu_mul_nvfp4(x, torch.ones(3), masked_m=torch.tensor([5, 1, 0], dtype=torch.int32))
    assert q.shape == (3, 5, 40) and s.shape == (3, 128, 8)  # 5 groups of 16, padded to 8
    q, s = fp8quant.silu_mul_mxfp8(x[..., :128])
    assert q.shape == (3, 5, 64) and s.shape == (3, 128, 4) and s.dtype == torch.float8_e8m0fnu


@pytest.mark.parametrize(
    ("call", "error", "match"),
    [
        (lambda x: fp8quant.silu_mul_mxfp8(x[:, :96]), ValueError, r"N=48\) must be a positive multiple of the group size \(32\)"),
        (lambda x: fp8quant.silu_mul_mxfp8(x, recipe="up"), ValueError, "recipe must be one of"),
        (lambda x: fp8quant.silu_mul_nvfp4(x, torch.ones(3)), ValueError, r"global_scale must be a float32 tensor \[\]"),
        (lambda x: fp8quant.silu_mul_nvfp4(x, torch.ones(1), masked_m=torch.zeros(4, dtype=torch.int32)),
         ValueError, "masked_m does not apply"),
        (lambda x: fp8quant.silu_mul_mxfp8(x, m_indices=torch.zeros(3, dtype=torch.int32)), ValueError,
         r"m_indices must be a contiguous int32 tensor of shape \(4,\)"),
        (lambda x: fp8quant.silu_mul_mxfp8(x, row_offsets=torch.zeros(2, dtype=torch.int32)), ValueError,
         "row_offsets applies to the contiguous layout"),
        (lambda x: fp8quant.silu_mul_mxfp8(x.to(torch.int32)), TypeError, "x must be"),
    ],
)  # fmt: skip
def test_silu_mul_block_scaled_refusals(call, error, match):
    with pytest.raises(error, match=match):
        call(randn(4, 128))


# --- MoE dispatch -> NVFP4 -----------------------------------------------------------------------


@pytest.mark.parametrize("layout", ["contiguous", "masked"])
def test_moe_dispatch_nvfp4_rows(layout):
    """Each slot's row is the token quantized with its expert's encode scale; rows without a token
    are zero (data and scale bytes)."""
    gen = torch.Generator().manual_seed(3)
    ids = torch.randint(-1, 4, (30, 3), generator=gen, dtype=torch.int32)
    ids[0] = torch.tensor([2, 2, 2])  # a token whose slots all go to one expert
    routing = reference.moe_routing(ids, 4, align=16, max_m=90)
    x = randn(30, 96, seed=3)
    g = torch.tensor([40.0, 300.0, 7.0, 1000.0])
    kw = dict(layout=layout, max_m=90 if layout == "masked" else None, scale_layout="row")
    q, s = fp8quant.moe_dispatch_nvfp4(x, routing, g, **kw)
    rows = routing.masked_row if layout == "masked" else routing.inv_perm
    flat_q, flat_s = q.reshape(-1, 48), s.reshape(-1, 6)
    filled = torch.zeros(flat_q.shape[0], dtype=torch.bool)
    for t in range(30):
        for j in range(3):
            row, e = int(rows[t, j]), int(ids[t, j])
            if row < 0:
                assert e < 0
                continue
            q_t, s_t, _ = fp8quant.nvfp4_quant(x[t : t + 1], g[e], scale_layout="row")
            assert same(flat_q[row], q_t[0]) and same(flat_s[row], s_t[0])
            filled[row] = True
    assert not flat_q[~filled].any() and not flat_s[~filled].view(torch.uint8).any()
    one = fp8quant.moe_dispatch_nvfp4(x, routing, torch.tensor(300.0), **kw)  # one encode scale for all
    same_four = fp8quant.moe_dispatch_nvfp4(x, routing, torch.full((4,), 300.0), **kw)
    assert all(same(a, b) for a, b in zip(one, same_four, strict=True))


def test_moe_dispatch_nvfp4_refusals():
    routing = reference.moe_routing(torch.tensor([[0, 1], [1, -1]], dtype=torch.int32), 2, max_m=2)
    x = randn(2, 64)
    g = torch.ones(2)
    for call, error, match in [
        (lambda: fp8quant.moe_dispatch_nvfp4(x[:, :40], routing, g), ValueError, r"H=40\) must be a positive multiple"),
        (lambda: fp8quant.moe_dispatch_nvfp4(x, routing, torch.ones(3)), ValueError, r"\[\] or \[2\]"),
        (lambda: fp8quant.moe_dispatch_nvfp4(x, routing, g, layout="masked"), ValueError, "needs max_m"),
        (lambda: fp8quant.moe_dispatch_nvfp4(x, routing, g, scale_layout="mn_tma"), ValueError, "scale_layout"),
        (lambda: fp8quant.moe_dispatch_nvfp4(x[:1], routing, g), ValueError, "tokens"),
    ]:  # fmt: skip
        with pytest.raises(error, match=match):
            call()


def test_registered_schemas():
    schemas = {
        name: str(getattr(torch.ops.fp8quant, name).default._schema)
        for name in ("rms_norm_mxfp8", "add_rms_norm_nvfp4", "silu_mul_mxfp8", "silu_mul_nvfp4", "moe_dispatch_nvfp4")
    }
    assert schemas == {
        "rms_norm_mxfp8": "fp8quant::rms_norm_mxfp8(Tensor x, Tensor weight, float eps, str recipe, str scale_layout)"
        " -> (Tensor, Tensor)",
        "add_rms_norm_nvfp4": "fp8quant::add_rms_norm_nvfp4(Tensor x, Tensor(a!) residual, Tensor weight, "
        "Tensor global_scale, float eps, str scale_layout) -> (Tensor, Tensor)",
        "silu_mul_mxfp8": "fp8quant::silu_mul_mxfp8(Tensor x, Tensor m_indices, Tensor used_rows, Tensor masked_m, "
        "int align, str recipe, str scale_layout) -> (Tensor, Tensor)",
        "silu_mul_nvfp4": "fp8quant::silu_mul_nvfp4(Tensor x, Tensor m_indices, Tensor used_rows, Tensor masked_m, "
        "Tensor global_scale, int align, str scale_layout) -> (Tensor, Tensor)",
        "moe_dispatch_nvfp4": "fp8quant::moe_dispatch_nvfp4(Tensor x, Tensor slot_rows, Tensor counts, "
        "Tensor row_offsets, Tensor m_indices, Tensor global_scale, int rows, int max_m, int align, str scale_layout)"
        " -> (Tensor, Tensor)",
    }
    compiled = torch.compile(lambda x: fp8quant.silu_mul_mxfp8(x), backend="eager", fullgraph=True)
    x = randn(4, 128)
    assert all(same(a, b) for a, b in zip(compiled(x), fp8quant.silu_mul_mxfp8(x), strict=True))


# --- the C API without a GPU ---------------------------------------------------------------------


def _c():
    from fp8quant._ext import extension  # noqa: PLC0415

    return extension()


def test_c_api_refusals():
    """One bad argument at a time: ValueError starting with its name (validation runs before
    any device is needed)."""
    c = _c()
    silu = dict(x=1 << 20, x_dtype=2, batch=1, m=4, n=64, x_batch_stride=0, x_row_stride=128, q=2 << 20,
                q_batch_stride=0, q_row_stride=64, m_indices=0, used_rows=0, masked_m=0, align=128, scale=3 << 20,
                scale_layout=1)  # fmt: skip
    cases = [
        (c.silu_mul_mxfp8_ptr, silu | dict(recipe=0), [("n", 48), ("recipe", 3), ("scale_layout", 4), ("align", 0),
                                                      ("used_rows", 5 << 20), ("x_dtype", 9)]),
        (c.silu_mul_nvfp4_ptr, silu | dict(q_row_stride=32, global_scale=4 << 20, global_scales=1),
         [("n", 24), ("global_scale", 0), ("global_scales", 3), ("q_row_stride", 16)]),
    ]  # fmt: skip
    norm = dict(x=1 << 20, residual=0, weight=2 << 20, dtype=2, m=4, h=64, x_row_stride=64, residual_row_stride=0,
                eps=1e-6, q=3 << 20, q_row_stride=64, scale=4 << 20, scale_layout=1)  # fmt: skip
    cases += [
        (c.rms_norm_mxfp8_ptr, norm | dict(recipe=0), [("h", 48), ("recipe", 2), ("scale_layout", 3), ("dtype", 0)]),
        (c.rms_norm_nvfp4_ptr, norm | dict(q_row_stride=32, global_scale=5 << 20),
         [("h", 24), ("global_scale", 0), ("q_row_stride", 20)]),
    ]  # fmt: skip
    for entry, good, bad in cases:
        for name, value in bad:
            with pytest.raises(ValueError, match=rf"^{name}:"):
                entry(**(good | {name: value}), stream=0)
    dispatch = dict(x=1 << 20, x_dtype=2, tokens=4, h=64, x_row_stride=64, slot_rows=5 << 20, k=2, counts=6 << 20,
                    row_offsets=7 << 20, m_indices=8 << 20, experts=2, align=128, rows=256, max_m=0, q=2 << 20,
                    q_batch_stride=0, q_row_stride=32, scale=3 << 20, scale_layout=1, global_scale=4 << 20,
                    global_scales=2)  # fmt: skip
    for name, value in [("h", 40), ("k", 0), ("experts", 0), ("global_scales", 3), ("m_indices", 0), ("max_m", 4),
                        ("slot_rows", 0), ("q_row_stride", 16), ("scale_layout", 2)]:  # fmt: skip
        with pytest.raises(ValueError, match=rf"^{name}:"):
            c.moe_dispatch_nvfp4_ptr(**(dispatch | {name: value}), stream=0)
    with pytest.raises(ValueError, match="^masked_m: give m_indices"):
        c.silu_mul_mxfp8_ptr(**(silu | dict(m_indices=5 << 20, masked_m=6 << 20, recipe=0)), stream=0)
    with pytest.raises(ValueError, match="^q: overlaps global_scale"):
        c.rms_norm_nvfp4_ptr(**(norm | dict(q_row_stride=32, global_scale=(3 << 20) + 4)), stream=0)
