"""``python -m fp8quant bench --weights``: per_block_quant (128 x 128 blocks) on DeepSeek-V3's
weight shapes, device time against the copy bandwidth, beside PyTorch's cast of w to float8; and
requantize_ue8m0 of the resulting fp8 weight (a checkpoint made ready for DeepGEMM on Blackwell).

Same method as the activation bench: CUDA graphs of N calls over rotated buffers (at least
--rotation-mib in all), median of the replays; bytes are w read, q written and the scales.
"""

from __future__ import annotations

import torch

from ..weights import per_block_quant, requantize_ue8m0
from . import timing

__all__ = ["SHAPES", "run_weights"]

#: (N, K) of DeepSeek-V3's linear layers (the GEMM bench's shapes).
SHAPES = ((4096, 7168), (7168, 18432), (18432, 7168), (24576, 1536), (32768, 512), (7168, 16384))


def time_shape(n: int, k: int, dtype: torch.dtype, copy_gbps: float, rotation_bytes: int) -> list[timing.Result]:
    """per_block_quant with fp32 and with UE8M0 scales, and torch's cast, on one buffer rotation."""
    device = torch.device("cuda", torch.cuda.current_device())
    scale_shape = (-(-n // 128), -(-k // 128))
    cast_bytes = n * k * (dtype.itemsize + 1)
    nbytes = cast_bytes + 4 * scale_shape[0] * scale_shape[1]
    sets = timing.rotation_sets(nbytes, rotation_bytes)
    ws = [timing.random_input(n, k, dtype, device) for _ in range(sets)]
    qs = [torch.empty((n, k), dtype=torch.float8_e4m3fn, device=device) for _ in range(sets)]
    ss = [torch.empty(scale_shape, device=device) for _ in range(sets)]
    calls = timing.graph_calls(sets, timing.estimated_call_us(nbytes, copy_gbps))
    # requantize_ue8m0 reads an fp8 checkpoint weight and its scales, writes both again
    ckpt = [per_block_quant(w) for w in ws]
    requant_bytes = 2 * (n * k + 4 * scale_shape[0] * scale_shape[1])
    entries = (
        ("per_block_quant", nbytes, lambda i: per_block_quant(ws[i], out=(qs[i], ss[i]))),
        ("per_block_quant+ue8m0", nbytes, lambda i: per_block_quant(ws[i], ue8m0=True, out=(qs[i], ss[i]))),
        ("requantize_ue8m0", requant_bytes, lambda i: requantize_ue8m0(*ckpt[i], out=(qs[i], ss[i]))),
        ("torch cast", cast_bytes, lambda i: qs[i].copy_(ws[i])),
    )
    return [timing.Result(n, k, name, timing.time_graph(call, sets, calls), moved, sets, calls)
            for name, moved, call in entries]  # fmt: skip


def weight_shapes(ns: list[int] | None = None, k: int | None = None) -> list[tuple[int, int]]:
    """The ``(N, K)`` shapes to time: ``ns`` (--m) at ``k`` (--k, default timing.K_MAIN); SHAPES'
    N values at ``k`` with ``k`` alone; SHAPES without either."""
    if ns:
        return [(n, k or timing.K_MAIN) for n in ns]
    if k is not None:
        return [(n, k) for n in dict.fromkeys(n for n, _ in SHAPES)]
    return list(SHAPES)


def run_weights(args) -> int:
    return timing.run_shapes(
        args, weight_shapes(args.m, args.k if "k" in args.given else None), time_shape,
        refusal="--weights times the GPU kernel", labels=("N", "K"), op="per_block_quant", rows="N",
        granularity="128 x 128 blocks",
    )  # fmt: skip
