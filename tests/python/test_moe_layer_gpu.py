"""fp8quant.moe_layer on the GPU, every backend (DeepGEMM when it imports, fp8quant's Triton GEMM)
and both layouts: against the reference backend on the same quantized operands, against the
unquantized layer (calc_diff), garbage (NaN) in every byte the ops leave unwritten never reaching
an output, and CUDA-graph capture with static bounds. Marked ``gpu``."""

from __future__ import annotations

import pytest
import torch

import fp8quant
from fp8quant import grouped_gemm
from fp8quant.gemm import _have_deep_gemm, calc_diff
from fp8quant.moe_layer import ExpertWeights, _gemm, moe_layer_bf16, segment_align

pytestmark = pytest.mark.gpu

BACKENDS = [
    pytest.param("deep_gemm", marks=pytest.mark.skipif(
        not _have_deep_gemm() or not torch.cuda.is_available() or torch.cuda.get_device_capability()[0] != 9,
        reason="DeepGEMM does not import (or not SM90)")),
    pytest.param("triton", marks=pytest.mark.skipif(not grouped_gemm.available(), reason="needs Triton")),
]  # fmt: skip


def layer_inputs(t, *, h=1024, inter=512, e=32, k=8, seed=0):
    gen = torch.Generator(device="cuda").manual_seed(seed)
    x = torch.randn(t, h, generator=gen, device="cuda").to(torch.bfloat16)
    w13 = (torch.randn(e, 2 * inter, h, generator=gen, device="cuda") / h**0.5).to(torch.bfloat16)
    w2 = (torch.randn(e, h, inter, generator=gen, device="cuda") / inter**0.5).to(torch.bfloat16)
    weights, ids = torch.topk(torch.randn(t, e, generator=gen, device="cuda").softmax(-1), k)
    return x, ids.to(torch.int32), weights, w13, w2


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("layout", ["contiguous", "masked"])
@pytest.mark.parametrize("t", [1, 3, 16, 129, 600])
def test_layer(t, layout, backend):
    x, ids, weights, w13, w2 = layer_inputs(t)
    ids[0, -1] = -1  # a dropped slot
    q13, q2 = fp8quant.prepare_experts(w13), fp8quant.prepare_experts(w2)
    got = fp8quant.moe_layer(x, ids, weights, q13, q2, layout=layout, backend=backend)
    ref = fp8quant.moe_layer(x, ids, weights, q13, q2, layout="contiguous", backend="reference")
    exact = moe_layer_bf16(x, ids, weights, w13, w2)
    # The same quantized operands: only the GEMMs' float32 sums differ (order), and through them
    # an occasional bf16 rounding of the first GEMM's output and an fp8 rounding of its activation
    assert calc_diff(got.float(), ref.float()) < 2e-5
    diff = calc_diff(got.float(), exact)
    print(f"{backend} {layout} T={t}: calc_diff against the unquantized layer {diff:.3e}")
    assert diff < 2.5e-3  # the formats' floor: docs/contract.md, "MoE layer"
    assert torch.isfinite(got).all()


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("layout", ["contiguous", "masked"])
def test_garbage_never_reaches_an_output(layout, backend):
    """Every byte the MoE ops leave unwritten (padding rows' q, rows past the tiles, the GEMM
    outputs' padding rows) starts as NaN in one run and as 0 in another: the layer's outputs are
    bit-identical, and finite."""
    t = 40
    x, ids, weights, w13, w2 = layer_inputs(t, e=16, k=4)
    q13, q2 = fp8quant.prepare_experts(w13), fp8quant.prepare_experts(w2)
    e, two_i, h = q13.shape
    align = segment_align(backend, layout, 1)  # 16 on the Triton GEMM's contiguous layout, else 128
    bounds = fp8quant.moe_bounds(t, 4, e, align=align)
    masked = layout == "masked"
    max_m = 128 if backend == "deep_gemm" else bounds.max_m  # the layer's DEEP_GEMM_MASKED_ROWS
    routing = fp8quant.moe_routing(ids, e, align=align, max_m_sum=bounds.max_m_sum, max_m=max_m)
    rows = (e, max_m) if masked else (bounds.max_m_sum,)
    index = routing.counts if masked else routing.m_indices

    def run(fill_byte: int) -> torch.Tensor:
        def filled(outs):
            for o in outs:
                o.untyped_storage().fill_(fill_byte)
            return outs

        kw = {"layout": "masked", "max_m": max_m} if masked else {}
        q1, s1 = filled(fp8quant.moe_dispatch_quant(x, routing, **kw))
        fp8quant.moe_dispatch_quant(x, routing, **kw, out=(q1, s1))
        (y1,) = filled((torch.empty((*rows, two_i), dtype=torch.bfloat16, device="cuda"),))
        _gemm(backend, layout, (q1, s1), q13, y1, index, 1)
        skw = (
            {"masked_m": routing.counts}
            if masked
            else {"m_indices": routing.m_indices, "row_offsets": routing.row_offsets}
        )
        q2_, s2 = filled(fp8quant.silu_mul_quant(y1, **skw))
        fp8quant.silu_mul_quant(y1, **skw, out=(q2_, s2))
        (y2,) = filled((torch.empty((*rows, h), dtype=torch.bfloat16, device="cuda"),))
        _gemm(backend, layout, (q2_, s2), q2, y2, index, 1)
        return fp8quant.moe_combine(y2, routing.masked_row if masked else routing.inv_perm, weights)

    clean, dirty = run(0), run(0xFF)  # 0xFF bytes: NaN in float8_e4m3fn, bf16, float32 and UE8M0
    assert torch.isfinite(dirty).all()
    assert torch.equal(clean.view(torch.int16), dirty.view(torch.int16))


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("layout", ["contiguous", "masked"])
def test_cuda_graph(layout, backend):
    """Captured once for T tokens, replayed on new tokens and routings: the eager layer's bytes."""
    t = 24
    x, ids, weights, w13, w2 = layer_inputs(t)
    layer = fp8quant.MoELayer.from_weights(w13, w2, layout=layout, backend=backend)
    static = (x.clone(), ids.clone(), weights.clone())
    layer(*static)  # warm-up: JIT compilation outside the capture
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        layer(*static)
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        out = layer(*static)
    for seed in (1, 2):
        x2, ids2, weights2, _, _ = layer_inputs(t, seed=seed)
        for s, new in zip(static, (x2, ids2, weights2)):
            s.copy_(new)
        graph.replay()
        torch.cuda.synchronize()
        assert torch.equal(out, layer(x2, ids2, weights2))


def test_auto_picks_a_backend_and_layout():
    x, ids, weights, w13, w2 = layer_inputs(8)
    layer = fp8quant.MoELayer.from_weights(w13, w2)
    out = layer(x, ids, weights)
    ref = fp8quant.moe_layer(x, ids, weights, ExpertWeights(layer.w13_q, layer.w13_scale),
                             ExpertWeights(layer.w2_q, layer.w2_scale), backend="reference")  # fmt: skip
    assert calc_diff(out.float(), ref.float()) < 2e-5
