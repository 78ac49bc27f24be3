"""``python -m fp8quant bench --weights``: per_block_quant (128 x 128 blocks) on DeepSeek-V3's
weight shapes, device time against the copy bandwidth, beside PyTorch's cast of w to float8.

Same method as the activation bench: CUDA graphs of N calls over rotated buffers (at least
--rotation-mib in all), median of the replays; bytes are w read, q written and the scales.
"""

from __future__ import annotations

import torch

from . import bench
from .weights import per_block_quant

__all__ = ["SHAPES", "run_weights"]

#: (N, K) of DeepSeek-V3's linear layers (the GEMM bench's shapes).
SHAPES = ((4096, 7168), (7168, 18432), (18432, 7168), (24576, 1536), (32768, 512), (7168, 16384))


def time_shape(n: int, k: int, dtype: torch.dtype, ue8m0: bool, copy_gbps: float, rotation_bytes: int):
    device = torch.device("cuda", torch.cuda.current_device())
    scale_numel = -(-n // 128) * -(-k // 128)
    nbytes = n * k * (dtype.itemsize + 1) + 4 * scale_numel
    sets = bench.rotation_sets(nbytes, rotation_bytes)
    ws = [torch.randn((n, k), device=device).mul_(bench.INPUT_STD).to(dtype) for _ in range(sets)]
    qs = [torch.empty((n, k), dtype=torch.float8_e4m3fn, device=device) for _ in range(sets)]
    ss = [torch.empty((-(-n // 128), -(-k // 128)), device=device) for _ in range(sets)]
    calls = bench.graph_calls(sets, bench.estimated_call_us(nbytes, copy_gbps))
    results = []
    for name, call in (
        ("per_block_quant" + ("+ue8m0" if ue8m0 else ""), lambda i: per_block_quant(ws[i], ue8m0=ue8m0, out=(qs[i], ss[i]))),
        ("torch cast", lambda i: qs[i].copy_(ws[i])),
    ):
        us = bench.time_graph(call, sets, calls)
        moved = nbytes if name != "torch cast" else n * k * (dtype.itemsize + 1)
        results.append(bench.Result(n, k, name, us, moved, sets, calls))
    return results


def run_weights(args) -> int:
    if not torch.cuda.is_available():
        raise SystemExit("--weights times the GPU kernel; no CUDA GPU was found")
    device = torch.device("cuda", torch.cuda.current_device())
    copy_gbps = bench.copy_bandwidth_gbps(device)
    report = bench.Report(
        device=torch.cuda.get_device_name(device),
        dtype=args.dtype,
        group_size=128,
        method=bench.method_text(args.rotation_mib) + " Weights: per_block_quant, 128 x 128 blocks.",
        copy_gbps=copy_gbps,
    )
    shapes = [(m, args.k) for m in args.m] if args.m else SHAPES
    for index, (n, k) in enumerate(shapes, 1):
        bench.progress(f"[{index}/{len(shapes)}] N={n} K={k}")
        for ue8m0 in (False, True):
            results = time_shape(n, k, bench.DTYPES[args.dtype], ue8m0, copy_gbps, args.rotation_mib << 20)
            report.results += results if not ue8m0 else results[:1]
        torch.cuda.empty_cache()
    print(report.table().replace("     M      K", "     N      K"), flush=True)
    if args.markdown:
        with open(args.markdown, "w", encoding="utf-8") as f:
            text = report.markdown().replace("### per_token_group_quant", "### per_block_quant")
            f.write(text.replace(", group size 128", ", 128 x 128 blocks").replace("| M |", "| N |"))
    return 0
