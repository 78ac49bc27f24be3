"""GPU tests of the fused producers of MXFP8 and NVFP4 (issue 28): ``rms_norm_mxfp8``,
``rms_norm_nvfp4`` (with and without the residual), ``silu_mul_mxfp8``, ``silu_mul_nvfp4``
(plain rows, the contiguous and the masked MoE layouts) and ``moe_dispatch_nvfp4`` (per-expert
encode scales, both layouts). Each kernel must be bit-identical to
``fp8quant.reference`` on random data (never zeros), with out= buffers poisoned and guarded:
every byte of a written row's scales, the swizzled layout's padding included, must be written;
the MoE layouts' rows without tokens must be neither read (they hold NaN) nor written outside
the tiles. Edge shapes (M in 1, 3, 4, 5, 127, 129, 4097, 70000; odd and even group counts),
every dtype, both recipes and layouts, per-expert encode scales, a non-default stream,
CUDA-graph capture with PDL on and off, and behind a PDL producer that writes the inputs late. Marked ``gpu``; not yet run on a GPU (written in a session without one)."""

from __future__ import annotations

import pytest
import torch
from gpu_harness import (
    check_graph,
    check_op,
    check_pdl_producer,
    check_side_stream,
    compare_outputs,
    nan_past_counts,
    pdl_setting,
)

import fp8quant
from fp8quant import reference as R
from fp8quant.moe import _dispatch_fp4 as DISPATCH_FP4
from fp8quant.moe import _silu_fp4 as SILU_FP4
from fp8quant.moe import _silu_mx as SILU_MX
from fp8quant.norm import _add_norm_fp4, _add_norm_mx, _norm_fp4, _norm_mx

pytestmark = pytest.mark.gpu

LAYOUTS = ("swizzled", "row")


def make_input(shape, dtype, gen) -> torch.Tensor:
    """Gaussian rows whose groups span many magnitudes (so scale bytes vary)."""
    x = torch.randn(shape, device="cuda", generator=gen)
    spread = torch.exp2(
        torch.randint(-12, 12, (*shape[:-1], -(-shape[-1] // 16), 1), device="cuda", generator=gen).float()
    )
    return (x * spread.repeat_interleave(16, -1).flatten(-2)[..., : shape[-1]]).to(dtype)


def row_mask(buffers, q_rows: torch.Tensor, scale_rows: torch.Tensor, layout: str):
    """``written`` masks (gpu_harness.compare_outputs) of outputs ``(q [*, M, K'], scale)`` whose
    rows ``q_rows`` (bool ``[*, M]``) hold tokens and whose scale rows ``scale_rows`` (bool
    ``[*, rows]``, the layout's padded rows) lie in a tile; a swizzled buffer's bytes follow
    the swizzle."""
    qb, sb = buffers
    q_mask = q_rows.unsqueeze(-1).expand(*q_rows.shape, qb.shape[-1])
    full = scale_rows.unsqueeze(-1).expand(*sb.shape).to(torch.uint8)
    if layout == "swizzled":
        full = R.mx.to_swizzled(full.contiguous())  # shape already padded: a permutation of the bytes
    return q_mask, full.bool().flatten()


# --- RMSNorm -> MXFP8 / NVFP4 --------------------------------------------------------------------


def check_norm(fmt, x, w, layout, *, residual=None, recipe="rceil", g=None):
    eps = 1e-6
    if fmt == "mxfp8":
        refs = R.rms_norm_mxfp8(x, w, eps, residual=residual, recipe=recipe, scale_layout=layout)
        op = _norm_mx if residual is None else _add_norm_mx
        tensors = (x, w) if residual is None else (x, residual, w)
        buffers = op.buffers(*tensors, eps, recipe, layout)

        def call(out=None, r=None):
            return fp8quant.rms_norm_mxfp8(x, w, eps, residual=r, recipe=recipe, scale_layout=layout, out=out)
    else:
        refs = R.rms_norm_nvfp4(x, w, g, eps, residual=residual, scale_layout=layout)
        op = _norm_fp4 if residual is None else _add_norm_fp4
        tensors = (x, w, g) if residual is None else (x, residual, w, g)
        buffers = op.buffers(*tensors, eps, layout)

        def call(out=None, r=None):
            return fp8quant.rms_norm_nvfp4(x, w, g, eps, residual=r, scale_layout=layout, out=out)

    if residual is None:
        check_op(call, refs, buffers, x=x)
        return
    # The residual is updated in place: each run starts from a fresh copy, compared after
    copies = []

    def with_residual(out=None):
        copies.append(residual.clone())
        return call(out=out, r=copies[-1])[:2]

    check_op(with_residual, refs[:2], buffers)
    assert all(torch.equal(c, refs[2]) for c in copies), "the residual must hold x + residual"


@pytest.mark.parametrize("layout", LAYOUTS)
@pytest.mark.parametrize("fmt", ["mxfp8", "nvfp4"])
@pytest.mark.parametrize("m", [1, 3, 4, 5, 127, 129, 4097])
def test_rms_norm_block_scaled(m, fmt, layout, gen):
    for h in (96, 7168) if m < 4097 else (7168,):  # MXFP8: 3 and 224 groups; NVFP4: 6 and 448
        x, w = make_input((m, h), torch.bfloat16, gen), make_input((h,), torch.bfloat16, gen)
        check_norm(fmt, x, w, layout, g=torch.tensor(448 * 6 / 40.0, device="cuda"))


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16], ids=["bf16", "fp16"])
@pytest.mark.parametrize("fmt", ["mxfp8", "nvfp4"])
def test_rms_norm_block_scaled_residual_and_recipes(fmt, dtype, gen):
    x, w, r = (make_input(s, dtype, gen) for s in ((130, 1056), (1056,), (130, 1056)))
    g = torch.tensor(2.0, device="cuda")  # small: the group scales reach the e4m3 subnormals
    check_norm(fmt, x, w, "swizzled", residual=r, g=g)
    check_norm(fmt, x, w, "row", residual=r, recipe="floor", g=torch.tensor(1e30, device="cuda"))  # saturates


def test_rms_norm_block_scaled_large_m_stream_graph(gen):
    x, w = make_input((70000, 256), torch.bfloat16, gen), make_input((256,), torch.bfloat16, gen)
    check_norm("mxfp8", x, w, "swizzled")
    g = torch.tensor(100.0, device="cuda")
    x = make_input((129, 2048), torch.bfloat16, gen)
    w = make_input((2048,), torch.bfloat16, gen)
    buffers = _norm_fp4.buffers(x, w, g, 1e-6, "swizzled")

    def call(out=None):
        return fp8quant.rms_norm_nvfp4(x, w, g, out=out)

    check_side_stream(call, R.rms_norm_nvfp4(x, w, g), buffers, x=x)
    for pdl in (True, False):
        with pdl_setting(pdl):
            for variant in ("out", "allocate"):
                check_graph(call, lambda: x.copy_(make_input(x.shape, x.dtype, gen)),
                            lambda: R.rms_norm_nvfp4(x, w, g), buffers, variant=variant)  # fmt: skip


@pytest.mark.parametrize("fmt", ["mxfp8", "nvfp4"])
def test_rms_norm_block_scaled_pdl_producer(fmt, gen):
    """Behind a producer that lets the kernel launch at once and writes x, the weight (and the
    encode scale) late, the kernel reads the final values and writes nothing before it is done
    (gpu_harness.check_pdl_producer)."""
    x, w = make_input((1024, 7168), torch.bfloat16, gen), make_input((7168,), torch.bfloat16, gen)
    stale = [make_input(x.shape, x.dtype, gen), make_input(w.shape, w.dtype, gen)]
    if fmt == "mxfp8":
        inputs, refs, buffers = [x, w], R.rms_norm_mxfp8(x, w), _norm_mx.buffers(x, w, 1e-6, "rceil", "swizzled")
        call = lambda out=None: fp8quant.rms_norm_mxfp8(x, w, out=out)
    else:
        g = torch.tensor(448 * 6 / 40.0, device="cuda")
        stale.append(g * 3)
        inputs, refs, buffers = [x, w, g], R.rms_norm_nvfp4(x, w, g), _norm_fp4.buffers(x, w, g, 1e-6, "swizzled")
        call = lambda out=None: fp8quant.rms_norm_nvfp4(x, w, g, out=out)
    check_pdl_producer(call, inputs, stale, refs, buffers)


# --- SiLU-and-mul -> MXFP8 / NVFP4 ---------------------------------------------------------------


def align_up(n: torch.Tensor, a: int) -> torch.Tensor:
    return (n + a - 1) // a * a


def silu_written(buffers, layout, x, m_indices, row_offsets, masked_m, align):
    """What the SiLU ops write (docs/contract.md, "MoE"): q of the rows that hold tokens; the
    scale bytes of every row in a tile (padding rows' as 0), nothing past the tiles. Without
    row_offsets every row is in a tile, the swizzled layout's padding rows past M too."""
    rows = torch.arange(buffers[1].shape[-2], device="cuda")
    if m_indices is not None:
        used = m_indices.numel() if row_offsets is None else int(row_offsets[-1])
        live = (m_indices >= 0) & (torch.arange(m_indices.numel(), device="cuda") < used)
        return row_mask(buffers, live, rows < (rows.numel() if row_offsets is None else used), layout)
    if masked_m is not None:
        live = torch.arange(x.shape[1], device="cuda") < masked_m.unsqueeze(1)
        return row_mask(buffers, live, rows < align_up(masked_m, align).unsqueeze(1), layout)
    return None


def check_silu(fmt, x, layout, *, g=None, recipe="rceil", m_indices=None, row_offsets=None, masked_m=None, align=128):
    empty = torch.empty(0, dtype=torch.int32, device="cuda")
    mi = empty if m_indices is None else m_indices
    used = empty if row_offsets is None else row_offsets[-1:]
    mm = empty if masked_m is None else masked_m
    rows = dict(m_indices=m_indices, masked_m=masked_m)
    if fmt == "mxfp8":
        refs = R.silu_mul_mxfp8(x, recipe=recipe, scale_layout=layout, **rows)
        buffers = SILU_MX.buffers(x, mi, used, mm, align, recipe, layout)
        call = lambda out=None: fp8quant.silu_mul_mxfp8(x, recipe=recipe, scale_layout=layout, row_offsets=row_offsets,
                                                         align=align, out=out, **rows)  # fmt: skip
    else:
        refs = R.silu_mul_nvfp4(x, g, scale_layout=layout, **rows)
        buffers = SILU_FP4.buffers(x, mi, used, mm, g, align, layout)
        call = lambda out=None: fp8quant.silu_mul_nvfp4(x, g, scale_layout=layout, row_offsets=row_offsets,
                                                         align=align, out=out, **rows)  # fmt: skip
    check_op(call, refs, buffers, written=silu_written(buffers, layout, x, m_indices, row_offsets, masked_m, align))


@pytest.mark.parametrize("layout", LAYOUTS)
@pytest.mark.parametrize("fmt", ["mxfp8", "nvfp4"])
@pytest.mark.parametrize("m", [1, 3, 5, 127, 4097])
def test_silu_mul_block_scaled_plain(m, fmt, layout, gen):
    g = torch.tensor(448 * 6 / 30.0, device="cuda")
    for n in (96, 2048) if m < 4097 else (2048,):  # 3 and 64 MXFP8 groups; 6 and 128 NVFP4 groups
        check_silu(fmt, make_input((m, 2 * n), torch.bfloat16, gen), layout, g=g)


@pytest.mark.parametrize("dtype", [torch.float16, torch.float32], ids=["fp16", "fp32"])
@pytest.mark.parametrize("fmt", ["mxfp8", "nvfp4"])
def test_silu_mul_block_scaled_dtypes(fmt, dtype, gen):
    x = make_input((130, 2 * 640), dtype, gen)
    check_silu(fmt, x, "swizzled", g=torch.tensor(7.0, device="cuda"), recipe="floor")


@pytest.mark.parametrize("layout", LAYOUTS)
@pytest.mark.parametrize("fmt", ["mxfp8", "nvfp4"])
def test_silu_mul_block_scaled_moe_layouts(fmt, layout, gen):
    ids = torch.randint(-1, 8, (200, 2), generator=gen, device="cuda", dtype=torch.int32)
    routing = R.moe_routing(ids, 8, align=128, max_m_sum=200 * 2 + 8 * 127 + 130)  # rows past M_sum too
    x = make_input((routing.m_indices.numel(), 2 * 512), torch.bfloat16, gen)
    x[routing.m_indices < 0] = float("nan")  # padding rows must not be read
    g_experts = torch.rand(8, generator=gen, device="cuda") * 1000 + 1
    g = g_experts if fmt == "nvfp4" else None
    check_silu(fmt, x, layout, g=g, m_indices=routing.m_indices)
    check_silu(fmt, x, layout, g=g, m_indices=routing.m_indices, row_offsets=routing.row_offsets)
    stale = routing.m_indices.clone()
    stale[int(routing.row_offsets[-1]) + 1] = 3  # an expert id past M_sum: with row_offsets, untouched
    check_silu(fmt, x, layout, g=g, m_indices=stale, row_offsets=routing.row_offsets)
    xm = make_input((8, 97, 2 * 512), torch.bfloat16, gen)
    masked_m = torch.randint(0, 98, (8,), generator=gen, device="cuda", dtype=torch.int32)
    masked_m[0], masked_m[1], masked_m[2] = 0, 97, 33  # without tokens; full; a tile past max_m
    nan_past_counts(xm, masked_m)
    for align in (128, 16):
        check_silu(fmt, xm, layout, g=g, masked_m=masked_m, align=align)
    if fmt == "nvfp4":
        check_silu(fmt, xm, layout, g=torch.tensor(50.0, device="cuda"), masked_m=masked_m)  # one for all


@pytest.mark.parametrize("layout", LAYOUTS)
@pytest.mark.parametrize("fmt", ["mxfp8", "nvfp4"])
def test_silu_mul_block_scaled_masked_walk(fmt, layout, gen):
    """Masked layouts with four waves of block tiles or more: the launch's grid of two waves walks
    the tiles of all experts, each block two or more. Blocks of several rows (I = 512) and of a
    row or less (I = 3072, MXFP8 96 slots, NVFP4 192; max_m = 16: a few tiles a block); 200
    experts of 130 rows (76800 swizzled tiles: a lane's tiles cross experts between rounds).
    Experts empty, full, with tiles ending inside and past max_m and exactly at 128 rows, and with
    the rows on a few experts (the first idle, the last full)."""
    for experts, max_m, n in ((256, 130, 512), (256, 40, 3072), (256, 16, 3072), (200, 130, 3072)):
        xm = make_input((experts, max_m, 2 * n), torch.bfloat16, gen)
        spread = torch.randint(0, max_m + 1, (experts,), generator=gen, device="cuda", dtype=torch.int32)
        spread[0], spread[1], spread[2], spread[3] = 0, max_m, 17, min(128, max_m)
        skewed = torch.zeros(experts, dtype=torch.int32, device="cuda")
        skewed[5], skewed[100], skewed[-1] = max_m, 1, max_m
        g = torch.rand(experts, generator=gen, device="cuda") * 1000 + 1 if fmt == "nvfp4" else None
        for masked_m in (spread, skewed):
            x = xm.clone()
            nan_past_counts(x, masked_m)
            for align in (128, 16):
                check_silu(fmt, x, layout, g=g, masked_m=masked_m, align=align)


def test_silu_mul_block_scaled_unaligned_stream_graph(gen):
    wide = make_input((77, 2 * 384 + 16), torch.bfloat16, gen)
    check_silu("mxfp8", wide[:, 1 : 1 + 2 * 384], "swizzled")  # misaligned rows: the element-wise path
    check_silu("nvfp4", wide[:, 8 : 8 + 2 * 384], "row", g=torch.tensor(3.0, device="cuda"))
    x = make_input((300, 2 * 1024), torch.bfloat16, gen)
    masked = make_input((4, 64, 2 * 1024), torch.bfloat16, gen)
    counts = torch.tensor([64, 0, 17, 40], dtype=torch.int32, device="cuda")
    empty = torch.empty(0, dtype=torch.int32, device="cuda")
    buffers = SILU_MX.buffers(x, empty, empty, empty, 128, "rceil", "swizzled")
    call = lambda out=None: fp8quant.silu_mul_mxfp8(x, out=out)
    check_side_stream(call, R.silu_mul_mxfp8(x), buffers)
    for pdl in (True, False):
        with pdl_setting(pdl):
            check_graph(call, lambda: x.copy_(make_input(x.shape, x.dtype, gen)), lambda: R.silu_mul_mxfp8(x),
                        buffers, variant="out")  # fmt: skip
    # Masked, the counts changed between replays (a decode step's routing)
    g = torch.full((4,), 20.0, device="cuda")
    buffers = SILU_FP4.buffers(masked, empty, empty, counts, g, 128, "swizzled")
    call = lambda out=None: fp8quant.silu_mul_nvfp4(masked, g, masked_m=counts, out=out)

    def new_inputs():
        masked.copy_(make_input(masked.shape, masked.dtype, gen))
        counts.copy_(torch.randint(0, 65, (4,), generator=gen, device="cuda", dtype=torch.int32))

    for pdl in (True, False):
        with pdl_setting(pdl):
            check_graph(call, new_inputs, lambda: R.silu_mul_nvfp4(masked, g, masked_m=counts), buffers,
                        variant="out", written=lambda: silu_written(buffers, "swizzled", masked, None, None, counts,
                                                                    128))  # fmt: skip


@pytest.mark.parametrize("fmt", ["mxfp8", "nvfp4"])
def test_silu_mul_block_scaled_masked_pdl_producer(fmt, gen):
    """The producer writes the masked rows, the counts (another routing before) and the encode
    scales late: the kernel reads the final ones, and only the rows they name."""
    masked = make_input((8, 96, 2 * 1024), torch.bfloat16, gen)
    counts = torch.tensor([96, 0, 17, 40, 1, 0, 64, 95], dtype=torch.int32, device="cuda")
    stale = [make_input(masked.shape, masked.dtype, gen), counts.flip(0).contiguous()]
    empty = torch.empty(0, dtype=torch.int32, device="cuda")
    if fmt == "mxfp8":
        inputs = [masked, counts]
        buffers = SILU_MX.buffers(masked, empty, empty, counts, 128, "rceil", "swizzled")
        refs = R.silu_mul_mxfp8(masked, masked_m=counts)
        call = lambda out=None: fp8quant.silu_mul_mxfp8(masked, masked_m=counts, out=out)
    else:
        g = torch.rand(8, generator=gen, device="cuda") * 100 + 1
        inputs = [masked, counts, g]
        stale.append(g.flip(0).contiguous())
        buffers = SILU_FP4.buffers(masked, empty, empty, counts, g, 128, "swizzled")
        refs = R.silu_mul_nvfp4(masked, g, masked_m=counts)
        call = lambda out=None: fp8quant.silu_mul_nvfp4(masked, g, masked_m=counts, out=out)
    written = silu_written(buffers, "swizzled", masked, None, None, counts.clone(), 128)
    check_pdl_producer(call, inputs, stale, refs, buffers, written=written)


# --- MoE dispatch -> NVFP4 -----------------------------------------------------------------------


def dispatch_written(buffers, routing, layout, max_m, scale_layout, align=128):
    """What moe_dispatch_nvfp4 writes: q of the rows holding a token; the scale bytes of every
    row of each expert's tile (below M_sum when contiguous)."""
    rows = torch.arange(buffers[1].shape[-2], device="cuda")
    if layout == "contiguous":
        live = torch.zeros(routing.m_indices.numel(), dtype=torch.bool, device="cuda")
        live[routing.inv_perm[routing.inv_perm >= 0].long()] = True
        return row_mask(buffers, live, rows < int(routing.row_offsets[-1]), scale_layout)
    counts = routing.counts.unsqueeze(1)
    return row_mask(buffers, torch.arange(max_m, device="cuda") < counts, rows < align_up(counts, align), scale_layout)


def check_dispatch(x, routing, g, layout, max_m, scale_layout, align=128):
    refs = R.moe_dispatch_nvfp4(x, routing, g, layout=layout, max_m=max_m, scale_layout=scale_layout)
    slot_rows = routing.masked_row if layout == "masked" else routing.inv_perm
    buffers = DISPATCH_FP4.buffers(x, slot_rows, routing.counts, routing.row_offsets, routing.m_indices, g,
                                   routing.m_indices.numel(), max_m or 0, align, scale_layout)  # fmt: skip
    check_op(
        lambda out=None: fp8quant.moe_dispatch_nvfp4(x, routing, g, layout=layout, max_m=max_m, align=align,
                                                     scale_layout=scale_layout, out=out),
        refs, buffers, written=dispatch_written(buffers, routing, layout, max_m, scale_layout, align),
    )  # fmt: skip


@pytest.mark.parametrize("e", [8, 256])
@pytest.mark.parametrize("k", [1, 2, 8])
@pytest.mark.parametrize("t", [1, 7, 4096])
def test_moe_dispatch_nvfp4(t, k, e, gen):
    ids = torch.randint(-1, 2 * e, (t, k), generator=gen, device="cuda", dtype=torch.int32)
    routing = fp8quant.moe_routing(ids, e, expert_offset=e // 2, max_m=t * k)  # other ranks own half the ids
    h = 7168 if t * k * e <= 7 * 8 * 256 else 1024
    x = make_input((t, h), torch.bfloat16, gen)
    g = torch.rand(e, generator=gen, device="cuda") * 2000 + 0.5
    for scale_layout in LAYOUTS:
        check_dispatch(x, routing, g, "contiguous", None, scale_layout)
    if t * k <= 64:  # the masked layout's rows grow with max_m
        check_dispatch(x, routing, g, "masked", t * k, "swizzled")
        check_dispatch(x, routing, g[0], "masked", t * k, "row")  # one encode scale for all


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16, torch.float32], ids=["bf16", "fp16", "fp32"])
def test_moe_dispatch_nvfp4_dtypes_odd_groups_trailing_rows(dtype, gen):
    ids = torch.randint(-1, 8, (100, 2), generator=gen, device="cuda", dtype=torch.int32)
    routing = fp8quant.moe_routing(ids, 8, max_m_sum=100 * 2 + 8 * 128 + 3, max_m=41)  # rows past M_sum too
    x = make_input((100, 16 * 13), dtype, gen)  # 13 groups: the swizzled slots pad to 16
    g = torch.rand(8, generator=gen, device="cuda") * 100 + 1
    for scale_layout in LAYOUTS:
        check_dispatch(x, routing, g, "contiguous", None, scale_layout)
        for align in (128, 16, 1):
            check_dispatch(x, routing, g, "masked", 41, scale_layout, align)


def test_moe_dispatch_nvfp4_unaligned_graph(gen):
    ids = torch.randint(0, 8, (64, 4), generator=gen, device="cuda", dtype=torch.int32)
    routing = fp8quant.moe_routing(ids, 8, max_m_sum=64 * 4 + 8 * 128)
    g = torch.rand(8, generator=gen, device="cuda") * 100 + 1
    wide = make_input((64, 1024 + 16), torch.bfloat16, gen)
    check_dispatch(wide[:, 8:1032], routing, g, "contiguous", None, "swizzled")  # rows 16-byte aligned, strided
    check_dispatch(wide[:, 1:1025], routing, g, "contiguous", None, "row")  # misaligned: element-wise
    x = make_input((64, 1024), torch.bfloat16, gen)
    buffers = DISPATCH_FP4.buffers(x, routing.inv_perm, routing.counts, routing.row_offsets, routing.m_indices, g,
                                   routing.m_indices.numel(), 0, 128, "swizzled")  # fmt: skip
    written = dispatch_written(buffers, routing, "contiguous", None, "swizzled")
    call = lambda out=None: fp8quant.moe_dispatch_nvfp4(x, routing, g, out=out)
    check_side_stream(call, R.moe_dispatch_nvfp4(x, routing, g), buffers, written=written)
    for pdl in (True, False):
        with pdl_setting(pdl):
            check_graph(call, lambda: x.copy_(make_input(x.shape, x.dtype, gen)),
                        lambda: R.moe_dispatch_nvfp4(x, routing, g), buffers, variant="out",
                        written=lambda: written)  # fmt: skip


def test_moe_dispatch_nvfp4_pdl_producer(gen):
    """The producer writes x, the encode scales and the routing's row maps (another routing
    before) late: the kernel reads the final ones and writes nothing before it is done."""
    e, t, k = 8, 256, 4
    ids = torch.randint(0, e, (t, k), generator=gen, device="cuda", dtype=torch.int32)
    other = torch.randint(0, e, (t, k), generator=gen, device="cuda", dtype=torch.int32)
    bound = t * k + e * 127
    routing, stale_routing = (fp8quant.moe_routing(i, e, max_m_sum=bound) for i in (ids, other))
    x = make_input((t, 1024), torch.bfloat16, gen)
    g = torch.rand(e, generator=gen, device="cuda") * 100 + 1
    buffers = DISPATCH_FP4.buffers(x, routing.inv_perm, routing.counts, routing.row_offsets, routing.m_indices, g,
                                   routing.m_indices.numel(), 0, 128, "swizzled")  # fmt: skip
    written = dispatch_written(buffers, routing, "contiguous", None, "swizzled")
    maps = [routing.inv_perm, routing.counts, routing.row_offsets, routing.m_indices]
    stale_maps = [stale_routing.inv_perm, stale_routing.counts, stale_routing.row_offsets, stale_routing.m_indices]
    check_pdl_producer(lambda out=None: fp8quant.moe_dispatch_nvfp4(x, routing, g, out=out), [x, g, *maps],
                       [make_input(x.shape, x.dtype, gen), g.flip(0).contiguous(), *stale_maps],
                       R.moe_dispatch_nvfp4(x, routing, g), buffers, written=written)  # fmt: skip


def test_silu_then_norm_consumers_agree(gen):
    """The fused ops against their unfused chains on the GPU: silu_and_mul then quant; norm then quant."""
    x = make_input((64, 2 * 256), torch.bfloat16, gen)
    y = R.silu_and_mul(x)
    compare_outputs(fp8quant.silu_mul_mxfp8(x), fp8quant.mxfp8_quant(y), SILU_MX.buffers(
        x, *(torch.empty(0, dtype=torch.int32, device="cuda"),) * 3, 128, "rceil", "swizzled"), "silu vs chain")  # fmt: skip
    h, w = make_input((64, 256), torch.bfloat16, gen), make_input((256,), torch.bfloat16, gen)
    g = torch.tensor(30.0, device="cuda")
    compare_outputs(fp8quant.rms_norm_nvfp4(h, w, g), fp8quant.nvfp4_quant(fp8quant.rms_norm(h, w), g)[:2],
                    _norm_fp4.buffers(h, w, g, 1e-6, "swizzled"), "norm vs chain")  # fmt: skip
