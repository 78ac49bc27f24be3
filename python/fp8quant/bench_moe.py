"""``python -m fp8quant bench --moe``: the MoE combine at DeepSeek-V3's decode/prefill shape
(T tokens from --m, default 4096; H from --k, default 7168; k = 8 of E = 256 experts, about 3% of
slots dropped) against the copy bandwidth for the bytes it must move, beside the chain of PyTorch
ops it replaces (gather, weight, sum in float32, cast).

Same method as the other modes: CUDA graphs of N calls over rotated buffer sets, median of the
replays. Bytes: the expert rows read (one per kept slot), the output written, the slot indices
and weights.
"""

from __future__ import annotations

import torch

from . import bench, reference
from .moe import moe_combine

__all__ = ["run_moe"]

TOP_K = 8
EXPERTS = 256


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
    return [
        bench.Result(t, h, "moe_combine", fused, nbytes, sets, calls),
        bench.Result(t, h, "torch chain", chain, nbytes, sets, max(1, calls // 8)),
    ]


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
        op=f"moe_combine (k = {TOP_K} of E = {EXPERTS})",
        rows="T",
        granularity="fp32 accumulation",
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
