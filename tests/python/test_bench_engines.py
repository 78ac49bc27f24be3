"""fp8quant.bench.engines, the engines' Triton chain around DeepGEMM's grouped GEMMs: each kernel
against fp8quant's reference (quantization codes within one step where division rounds
differently, scales within 1 ulp; the layouts' invariants for the scatters, whose row order
comes from atomics; SiLU + quant and gather within their tolerances), CUDA-graph capture, and the
composed layer against a float32 PyTorch MoE of the dequantized weights (needs DeepGEMM). The
GPU tests are marked ``gpu``; one CPU test imports the module without Triton."""

from __future__ import annotations

import importlib.util
import sys
import types
from pathlib import Path

import pytest
import torch

import fp8quant
from fp8quant import reference as R
from fp8quant.bench import engines as BE
from fp8quant.layouts import align
from fp8quant.moe_layer import moe_layer_bf16

H, E, K, INTER = 7168, 256, 8, 2048  # DeepSeek-V3


# --- CPU -------------------------------------------------------------------------------------------


def test_imports_and_refuses_without_triton(monkeypatch):
    """With ``import triton`` failing the module still imports, and every function raises
    RuntimeError naming Triton before it looks at its arguments."""
    monkeypatch.setitem(sys.modules, "triton", None)
    monkeypatch.setitem(sys.modules, "triton.language", None)
    path = Path(fp8quant.__file__).parent / "bench" / "engines.py"
    spec = importlib.util.spec_from_file_location("fp8quant.bench._engines_without_triton", path)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    assert mod.triton is None
    x = torch.zeros(4, 256, dtype=torch.bfloat16)
    ids = torch.zeros(4, 2, dtype=torch.int32)
    w = torch.ones(4, 2)
    q = torch.zeros(4, 256, dtype=torch.float8_e4m3fn)
    s = torch.ones(4, 2)
    weight = types.SimpleNamespace(q=torch.zeros(8, 256, 256, dtype=torch.float8_e4m3fn), scale=torch.ones(8, 2, 2))
    calls = {
        "engine_quant": lambda: mod.engine_quant(x),
        "engine_scatter": lambda: mod.engine_scatter(q, s, ids, 8, 1024),
        "engine_dispatch_masked": lambda: mod.engine_dispatch_masked(q, s, ids, 8, 16),
        "engine_silu_quant": lambda: mod.engine_silu_quant(x),
        "engine_silu_quant_masked": lambda: mod.engine_silu_quant_masked(x.view(2, 2, 256), ids[:2, 0].contiguous()),
        "engine_gather": lambda: mod.engine_gather(x, ids, w),
        "engine_layer": lambda: mod.engine_layer(x, ids, w, weight, weight),
    }
    for name, call in calls.items():
        with pytest.raises(RuntimeError, match=r"^fp8quant\.bench\.engines needs Triton \(import triton failed\)"):
            call()
        assert name in mod.__all__
    # The default bounds are plain arithmetic
    assert mod.default_max_m_sum(4096, 8, 256) == 65280  # 32768 slots + 256 * 127, 128-aligned
    assert mod.default_max_m_sum(1, 8, 256) == 1024
    assert mod.default_max_m_sum(0, 8, 256) == 0
    assert (mod.default_max_m(1), mod.default_max_m(4096), mod.default_max_m(4097)) == (128, 4096, 4224)


def test_cpu_tensors_are_refused():
    """CPU tensors: RuntimeError, whether Triton is missing (this machine) or present (a GPU machine)."""
    with pytest.raises(RuntimeError, match=r"needs Triton|runs Triton kernels on CUDA tensors"):
        BE.engine_quant(torch.zeros(4, 256, dtype=torch.bfloat16))


# --- GPU: helpers -----------------------------------------------------------------------------------


def routed(t: int, e: int, k: int, gen, *, drop: float = 0.03) -> torch.Tensor:
    """topk ids [t, k] int32: k distinct experts per token (a softmax router's top-k), some slots
    dropped (-1)."""
    ids = torch.randn(t, e, generator=gen, device="cuda").topk(k, dim=1).indices.to(torch.int32)
    ids[torch.rand(t, k, generator=gen, device="cuda") < drop] = -1
    return ids.contiguous()


def tokens_of(ids: torch.Tensor) -> torch.Tensor:
    """The token of each slot, [T, k] int64."""
    t, k = ids.shape
    return torch.arange(t, device=ids.device).unsqueeze(1).expand(t, k)


def assert_codes_close(q: torch.Tensor, q_ref: torch.Tensor, max_fraction: float = 1e-3) -> None:
    """q equals q_ref but where x / s rounds differently (the engines' approximate division): there
    the codes are neighbours (same sign, magnitudes one step apart), and such places are rare."""
    if q.numel() == 0:
        return
    a, b = q.view(torch.uint8).int(), q_ref.view(torch.uint8).int()
    ma, mb = a & 0x7F, b & 0x7F
    assert int((ma - mb).abs().max()) <= 1
    nonzero = torch.maximum(ma, mb) > 0
    assert torch.equal((a >> 7)[nonzero], (b >> 7)[nonzero])
    assert float((a != b).float().mean()) <= max_fraction


def assert_scales_ulp(s: torch.Tensor, s_ref: torch.Tensor, ulps: int = 1) -> None:
    if s.numel() == 0:
        return
    diff = (s.contiguous().view(torch.int32).long() - s_ref.contiguous().view(torch.int32).long()).abs()
    assert int(diff.max()) <= ulps


def dequantize(q: torch.Tensor, s: torch.Tensor) -> torch.Tensor:
    """q * s with each group's scale over its 128 values."""
    return q.float() * s.repeat_interleave(128, dim=-1)


def check_silu_rows(q, s, y, q_ref, s_ref, live):
    """On the live rows: q * s within half an e4m3 step of the float32 silu(gate) * up that the
    kernel quantizes; scales within 2^-6 of the reference's (which rounds silu and the product to
    bf16 first); and the dequantized values within one e4m3 step of the reference's."""
    inter = y.shape[-1] // 2
    gate, up = y[..., :inter].float(), y[..., inter:].float()
    act = (torch.nn.functional.silu(gate) * up)[live]
    s_full = s[live].repeat_interleave(128, dim=-1)
    deq = dequantize(q[live], s[live])
    tol = torch.maximum(act.abs() * 2**-4, s_full * 2**-10) * 1.001
    assert bool(((deq - act).abs() <= tol).all())
    torch.testing.assert_close(s[live], s_ref[live], rtol=2**-6, atol=0)
    deq_ref = dequantize(q_ref[live], s_ref[live])
    assert bool(((deq - deq_ref).abs() <= deq_ref.abs() * 2**-2 + s_full * 2**-8).all())


# --- GPU: kernels -----------------------------------------------------------------------------------


@pytest.mark.gpu
@pytest.mark.parametrize("t, h", [(1, H), (7, H), (300, H), (4096, H), (5, 128), (0, 256)])
def test_quant(t, h, gen):
    x = torch.randn(t, h, generator=gen, device="cuda") * torch.rand(t, 1, generator=gen, device="cuda") * 8
    x = x.to(torch.bfloat16)
    if t > 2:
        x[1, 3], x[1, 200 % h], x[2, :128] = float("inf"), float("-inf"), 0  # non-finite values; a zero group
    q, s = BE.engine_quant(x)
    q_ref, s_ref = R.per_token_group_quant(x, 128, scale_layout="mn_tma")
    assert q.dtype == torch.float8_e4m3fn and q.shape == (t, h) and q.is_contiguous()
    assert s.dtype == torch.float32 and s.shape == (t, h // 128)
    if t > 1:
        assert s.stride() == (1, align(t, 4))
    assert_scales_ulp(s, s_ref)
    assert_codes_close(q, q_ref)
    # Where x is finite, q * s is within half an e4m3 step of x
    finite = torch.isfinite(x.float())
    deq, xf = dequantize(q, s)[finite], x.float()[finite]
    s_full = s.repeat_interleave(128, dim=-1)[finite]
    assert bool(((deq - xf).abs() <= torch.maximum(xf.abs() * 2**-4, s_full * 2**-10) * 1.001).all())


@pytest.mark.gpu
@pytest.mark.parametrize("t, e, k", [(1, E, K), (300, E, K), (4096, E, K), (77, 8, 2)])
def test_scatter(t, e, k, gen):
    x = torch.randn(t, H if e == E else 512, generator=gen, device="cuda").to(torch.bfloat16)
    ids = routed(t, e, k, gen)
    q, s = BE.engine_quant(x)
    max_m_sum = BE.default_max_m_sum(t, k, e)
    a_q, a_s, m_indices, inv = BE.engine_scatter(q, s, ids, e, max_m_sum)
    g = x.shape[1] // 128
    assert a_q.shape == (max_m_sum, x.shape[1]) and a_q.dtype == torch.float8_e4m3fn
    assert a_s.shape == (max_m_sum, g) and a_s.stride() == (1, align(max_m_sum, 4))
    assert m_indices.shape == (max_m_sum,) and inv.shape == (t, k)

    # m_indices: each expert's first count rows from its 128-aligned offset, -1 everywhere else (the
    # reference's, which does not depend on the order the atomics hand out rows in)
    routing = R.moe_routing(ids, e, max_m_sum=max_m_sum)
    assert torch.equal(m_indices, routing.m_indices)
    keep = inv >= 0
    assert torch.equal(keep, ids >= 0)
    rows = inv[keep].long()
    assert rows.unique().numel() == rows.numel()
    assert torch.equal(m_indices[rows], ids[keep])
    assert int((m_indices >= 0).sum()) == rows.numel()

    # Each kept slot's row holds its token's quantized row and scales, bit for bit
    tokens = tokens_of(ids)[keep]
    assert torch.equal(a_q.view(torch.uint8)[rows], q.view(torch.uint8)[tokens])
    assert torch.equal(a_s[rows], s[tokens])


@pytest.mark.gpu
def test_scatter_bound_and_int64_ids(gen):
    """A max_m_sum below M_sum: slots that find no row get -1 and nothing is written past the
    bound; int64 ids work too."""
    t, e, k = 64, 8, 4
    x = torch.randn(t, 256, generator=gen, device="cuda").to(torch.bfloat16)
    ids = routed(t, e, k, gen, drop=0.0).long()
    q, s = BE.engine_quant(x)
    a_q, a_s, m_indices, inv = BE.engine_scatter(q, s, ids, e, 128)
    rows = inv[inv >= 0].long()
    assert 0 < rows.numel() <= 128 and bool((rows < 128).all()) and rows.unique().numel() == rows.numel()
    assert torch.equal(a_q.view(torch.uint8)[rows], q.view(torch.uint8)[tokens_of(ids)[inv >= 0]])
    assert torch.equal(m_indices, R.moe_routing(ids, e, max_m_sum=10**6).m_indices[:128])


@pytest.mark.gpu
@pytest.mark.parametrize("t, e, k", [(1, E, K), (300, E, K), (77, 8, 2)])
def test_dispatch_masked(t, e, k, gen):
    h = H if e == E else 512
    x = torch.randn(t, h, generator=gen, device="cuda").to(torch.bfloat16)
    ids = routed(t, e, k, gen)
    q, s = BE.engine_quant(x)
    max_m = BE.default_max_m(t)
    a_q, a_s, masked_m, mrow = BE.engine_dispatch_masked(q, s, ids, e, max_m)
    ma = align(max_m, 4)
    assert a_q.shape == (e, max_m, h) and a_s.shape == (e, max_m, h // 128)
    assert a_s.stride() == (ma * (h // 128), 1, ma)
    keep = ids >= 0
    assert torch.equal(masked_m, torch.bincount(ids[keep].long(), minlength=e).to(torch.int32))
    assert torch.equal(mrow >= 0, keep)
    rows = mrow[keep].long()
    expert, rank = rows // max_m, rows % max_m
    assert torch.equal(expert, ids[keep].long()) and bool((rank < masked_m[expert]).all())
    assert rows.unique().numel() == rows.numel()
    tokens = tokens_of(ids)[keep]
    assert torch.equal(a_q.view(torch.uint8).view(e * max_m, h)[rows], q.view(torch.uint8)[tokens])
    assert torch.equal(a_s[expert, rank], s[tokens])


@pytest.mark.gpu
@pytest.mark.parametrize("m, inter", [(300, INTER), (1, INTER), (130, 256)])
def test_silu_quant(m, inter, gen):
    y = (torch.randn(m, 2 * inter, generator=gen, device="cuda") * 3).to(torch.bfloat16)
    q, s = BE.engine_silu_quant(y)
    assert q.shape == (m, inter) and q.dtype == torch.float8_e4m3fn and s.shape == (m, inter // 128)
    if m > 1:
        assert s.stride() == (1, align(m, 4))
    q_ref, s_ref = R.silu_mul_quant(y, 128, scale_layout="mn_tma")
    check_silu_rows(q, s, y, q_ref, s_ref, torch.ones(m, dtype=torch.bool, device="cuda"))

    # Contiguous layout: rows with m_indices -1 are skipped
    m_indices = torch.randint(-1, 4, (m,), generator=gen, device="cuda", dtype=torch.int32)
    q, s = BE.engine_silu_quant(y, m_indices)
    q_ref, s_ref = R.silu_mul_quant(y, 128, scale_layout="mn_tma", m_indices=m_indices)
    check_silu_rows(q, s, y, q_ref, s_ref, m_indices >= 0)


@pytest.mark.gpu
def test_silu_quant_masked(gen):
    e, max_m, inter = 8, 48, 512
    y = (torch.randn(e, max_m, 2 * inter, generator=gen, device="cuda") * 3).to(torch.bfloat16)
    masked_m = torch.tensor([0, 1, 5, 47, 48, 16, 3, 30], dtype=torch.int32, device="cuda")
    q, s = BE.engine_silu_quant_masked(y, masked_m)
    ma = align(max_m, 4)
    assert q.shape == (e, max_m, inter) and s.shape == (e, max_m, inter // 128)
    assert s.stride() == (ma * (inter // 128), 1, ma)
    q_ref, s_ref = R.silu_mul_quant(y, 128, scale_layout="mn_tma", masked_m=masked_m)
    live = torch.arange(max_m, device="cuda") < masked_m.unsqueeze(1)
    check_silu_rows(q, s, y, q_ref, s_ref, live)


@pytest.mark.gpu
@pytest.mark.parametrize("t, e, k, h", [(300, E, K, H), (1, E, K, H), (33, 8, 2, 1000)])
def test_gather(t, e, k, h, gen):
    ids = routed(t, e, k, gen)
    routing = R.moe_routing(ids, e, max_m=BE.default_max_m(t))
    w = torch.rand(t, k, generator=gen, device="cuda")
    y = torch.randn(routing.m_indices.numel(), h, generator=gen, device="cuda").to(torch.bfloat16)
    out = BE.engine_gather(y, routing.inv_perm, w)
    ref = R.moe_combine(y, routing.inv_perm, w)
    assert out.dtype == torch.bfloat16 and out.shape == (t, h)
    torch.testing.assert_close(out.float(), ref.float(), rtol=2**-7, atol=1e-4)

    # Masked layout: rows e * max_m + rank of [E, max_m, H]
    y3 = torch.randn(e, BE.default_max_m(t), h, generator=gen, device="cuda").to(torch.bfloat16)
    out = BE.engine_gather(y3, routing.masked_row, w)
    torch.testing.assert_close(out.float(), R.moe_combine(y3, routing.masked_row, w).float(), rtol=2**-7, atol=1e-4)


@pytest.mark.gpu
def test_chain_in_cuda_graph(gen):
    """quant, scatter, SiLU + quant and gather captured in one CUDA graph: a replay on new x gives
    what eager calls give (the rows compared through inv_perm, their order being the atomics')."""
    t, e, k, inter = 64, 16, 4, 256
    h = 2 * inter
    x = torch.randn(t, h, generator=gen, device="cuda").to(torch.bfloat16)
    ids = routed(t, e, k, gen)
    w = torch.rand(t, k, generator=gen, device="cuda")
    bound = BE.default_max_m_sum(t, k, e)

    def chain():
        q, s = BE.engine_quant(x)
        a_q, a_s, m_indices, inv = BE.engine_scatter(q, s, ids, e, bound)
        y = (a_q.float() * a_s.repeat_interleave(128, dim=-1)).to(torch.bfloat16)  # stands in for the GEMM
        q2, s2 = BE.engine_silu_quant(y, m_indices)
        return q, s, inv, q2, s2, BE.engine_gather(y, inv, w)

    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        chain()  # compiles the kernels
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        q, s, inv, q2, s2, out = chain()
    x.copy_(torch.randn(t, h, generator=gen, device="cuda"))
    graph.replay()
    torch.cuda.synchronize()
    q_e, s_e, inv_e, q2_e, s2_e, out_e = chain()
    assert torch.equal(q.view(torch.uint8), q_e.view(torch.uint8)) and torch.equal(s, s_e)
    keep = inv >= 0
    assert torch.equal(keep, inv_e >= 0)
    rows, rows_e = inv[keep].long(), inv_e[keep].long()
    assert torch.equal(q2.view(torch.uint8)[rows], q2_e.view(torch.uint8)[rows_e])
    assert torch.equal(s2[rows], s2_e[rows_e])
    assert torch.equal(out, out_e)


# --- GPU: the layer (DeepGEMM) ----------------------------------------------------------------------


def layer_case(gen, t=200, h=2048, inter=512, e=16, k=4):
    """x, routing and block-quantized weights (``.q``/``.scale`` objects), and the float32
    PyTorch MoE of the dequantized weights."""
    x = torch.randn(t, h, generator=gen, device="cuda").to(torch.bfloat16)
    logits = torch.randn(t, e, generator=gen, device="cuda")
    weights, ids = torch.topk(logits.softmax(-1), k)
    ids = ids.to(torch.int32).contiguous()
    weights = weights.contiguous()

    def weight(n: int, kk: int):
        w = (torch.randn(e, n, kk, generator=gen, device="cuda") / kk**0.5).to(torch.bfloat16)
        q, scale = fp8quant.per_block_quant(w)
        return types.SimpleNamespace(q=q, scale=scale), R.dequantize_blocks(q, scale)

    (w13, w13_f), (w2, w2_f) = weight(2 * inter, h), weight(h, inter)
    return x, ids, weights, w13, w2, moe_layer_bf16(x, ids, weights, w13_f, w2_f)


@pytest.mark.gpu
@pytest.mark.parametrize("layout", ["contiguous", "masked"])
def test_layer(layout, gen):
    pytest.importorskip("deep_gemm")
    from fp8quant.gemm import calc_diff  # noqa: PLC0415

    x, ids, weights, w13, w2, ref = layer_case(gen)
    out = BE.engine_layer(x, ids, weights, w13, w2, layout=layout)
    assert out.shape == x.shape and out.dtype == torch.bfloat16
    diff = calc_diff(out.float(), ref)
    print(f"engine_layer ({layout}): calc_diff {diff:.3e}")
    assert diff < 3e-3


@pytest.mark.gpu
@pytest.mark.parametrize("layout", ["contiguous", "masked"])
def test_layer_in_cuda_graph(layout, gen):
    """The whole layer, DeepGEMM's GEMMs included, captured in a CUDA graph (what the benchmark
    times): a replay on new tokens and a new routing gives the eager call's output on them."""
    pytest.importorskip("deep_gemm")
    from fp8quant.gemm import calc_diff  # noqa: PLC0415

    x, ids, weights, w13, w2, _ = layer_case(gen, t=64)
    BE.engine_layer(x, ids, weights, w13, w2, layout=layout)  # compiles every kernel
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        out = BE.engine_layer(x, ids, weights, w13, w2, layout=layout)
    new_x, new_ids, new_weights, *_ = layer_case(gen, t=64)
    x.copy_(new_x)
    ids.copy_(new_ids)
    weights.copy_(new_weights)
    out.fill_(float("nan"))  # a row the replay leaves unwritten fails below
    graph.replay()
    torch.cuda.synchronize()
    eager = BE.engine_layer(new_x, new_ids, new_weights, w13, w2, layout=layout)
    # The scatter's atomics order rows within an expert differently from call to call
    assert calc_diff(out.float(), eager.float()) < 1e-6
