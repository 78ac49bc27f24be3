"""``python -m fp8quant bench --moe``: the MoE ops at DeepSeek-V3's shape (T tokens from --m,
default 4096; H from --k, default 7168; k = 8 of E = 256 experts, about 3% of slots dropped;
intermediate size 2048), each against the copy bandwidth for the bytes it must move and beside
the chain of separate ops it replaces:

- moe_dispatch_quant (contiguous layout, mn_tma scales): reads each kept slot's token row, writes
  every row of q (padding included) and the scales; chain: PyTorch's gather, then fp8quant's
  quantizer.
- silu_mul_quant on the contiguous layout ``[M_sum, 2 * 2048]``: reads every row, writes q and
  scales; chain: ``F.silu(gate) * up``, then fp8quant's quantizer.
- moe_combine: reads the expert rows (one per kept slot), writes the output; chain: gather,
  weight, sum in float32, cast.

Same method as the other modes: CUDA graphs of N calls over rotated buffer sets, median of the
replays.
"""

from __future__ import annotations

import torch

from . import bench, reference
from .layouts import scale_spec
from .moe import moe_combine, moe_dispatch_quant, silu_mul_quant
from .quant import per_token_group_quant

__all__ = ["run_moe"]

TOP_K = 8
EXPERTS = 256
INTERMEDIATE = 2048  # DeepSeek-V3's moe_intermediate_size


def torch_combine(y: torch.Tensor, rows: torch.Tensor, weights: torch.Tensor) -> torch.Tensor:
    """What engines run without a fused kernel: gather the rows, weight them, sum in float32."""
    keep = (rows >= 0).unsqueeze(-1)
    gathered = y[rows.clamp(min=0).long()].float()  # [T, k, H]
    return (gathered * (weights.unsqueeze(-1) * keep)).sum(1).to(y.dtype)


def time_shape(t: int, h: int, dtype: torch.dtype, copy_gbps: float, rotation_bytes: int) -> list[bench.Result]:
    device = torch.device("cuda", torch.cuda.current_device())
    gen = torch.Generator(device=device).manual_seed(t)
    ids = torch.randint(0, EXPERTS, (t, TOP_K), generator=gen, device=device, dtype=torch.int32)
    ids[torch.rand((t, TOP_K), generator=gen, device=device) < 0.03] = -1
    routing = reference.moe_routing(ids, EXPERTS)
    rows = routing.inv_perm
    weights = torch.rand((t, TOP_K), generator=gen, device=device)
    kept = int((rows >= 0).sum())
    nbytes = (kept + t) * h * dtype.itemsize + 8 * t * TOP_K
    m_sum = routing.m_indices.numel()
    sets = bench.rotation_sets(m_sum * h * dtype.itemsize + t * h * dtype.itemsize, rotation_bytes)
    ys = [torch.randn(m_sum, h, generator=gen, device=device).to(dtype) for _ in range(sets)]
    outs = [torch.empty((t, h), dtype=dtype, device=device) for _ in range(sets)]
    calls = bench.graph_calls(sets, bench.estimated_call_us(nbytes, copy_gbps))
    fused = bench.time_graph(lambda i: moe_combine(ys[i], rows, weights, out=outs[i]), sets, calls)
    chain = bench.time_graph(lambda i: torch_combine(ys[i], rows, weights), sets, max(1, calls // 8))
    results = [
        bench.Result(t, h, "moe_combine", fused, nbytes, sets, calls),
        bench.Result(t, h, "combine chain", chain, nbytes, sets, max(1, calls // 8)),
    ]
    del ys, outs

    # Dispatch + quantize: each kept slot's token read, every row of q and the scales written
    scale_bytes = 4 * scale_spec("mn_tma", m_sum, h // 128).numel
    nbytes = kept * h * dtype.itemsize + m_sum * h + scale_bytes
    xs = [torch.randn(t, h, generator=gen, device=device).to(dtype) for _ in range(bench.rotation_sets(nbytes, rotation_bytes))]
    sets = len(xs)
    calls = bench.graph_calls(sets, bench.estimated_call_us(nbytes, copy_gbps))
    tokens = routing.row_token.clamp(min=0).long()
    fused = bench.time_graph(lambda i: moe_dispatch_quant(xs[i], routing, scale_layout="mn_tma"), sets, calls)
    chain = bench.time_graph(
        lambda i: per_token_group_quant(xs[i][tokens], 128, scale_layout="mn_tma"), sets, max(1, calls // 4)
    )
    results += [
        bench.Result(t, h, "dispatch+quant", fused, nbytes, sets, calls),
        bench.Result(t, h, "dispatch chain", chain, nbytes, sets, max(1, calls // 4)),
    ]
    del xs

    # SiLU-and-mul + quantize on the contiguous layout
    scale_bytes = 4 * scale_spec("mn_tma", m_sum, INTERMEDIATE // 128).numel
    nbytes = m_sum * 2 * INTERMEDIATE * dtype.itemsize + m_sum * INTERMEDIATE + scale_bytes
    hs = [torch.randn(m_sum, 2 * INTERMEDIATE, generator=gen, device=device).to(dtype)
          for _ in range(bench.rotation_sets(nbytes, rotation_bytes))]  # fmt: skip
    sets = len(hs)
    calls = bench.graph_calls(sets, bench.estimated_call_us(nbytes, copy_gbps))
    fused = bench.time_graph(lambda i: silu_mul_quant(hs[i], scale_layout="mn_tma"), sets, calls)
    chain = bench.time_graph(
        lambda i: per_token_group_quant(reference.silu_and_mul(hs[i]), 128, scale_layout="mn_tma"), sets,
        max(1, calls // 4),
    )  # fmt: skip
    results += [
        bench.Result(m_sum, 2 * INTERMEDIATE, "silu_mul_quant", fused, nbytes, sets, calls),
        bench.Result(m_sum, 2 * INTERMEDIATE, "silu chain", chain, nbytes, sets, max(1, calls // 4)),
    ]
    return results


def run_moe(args) -> int:
    if not torch.cuda.is_available():
        raise SystemExit("--moe times the GPU kernels; no CUDA GPU was found")
    device = torch.device("cuda", torch.cuda.current_device())
    copy_gbps = bench.copy_bandwidth_gbps(device)
    report = bench.Report(
        device=torch.cuda.get_device_name(device),
        dtype=args.dtype,
        group_size=128,
        method=bench.method_text(args.rotation_mib),
        copy_gbps=copy_gbps,
        op=f"MoE ops (k = {TOP_K} of E = {EXPERTS})",
        rows="rows",
        granularity="groups of 128, mn_tma scales",
    )
    ts = args.m or [4096]
    for index, t in enumerate(ts, 1):
        bench.progress(f"[{index}/{len(ts)}] T={t} H={args.k}")
        report.results += time_shape(t, args.k, bench.DTYPES[args.dtype], copy_gbps, args.rotation_mib << 20)
        torch.cuda.empty_cache()
    print(report.table(), flush=True)
    if args.markdown:
        with open(args.markdown, "w", encoding="utf-8") as f:
            f.write(report.markdown())
    return 0
