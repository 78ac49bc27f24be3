"""``python -m fp8quant bench --norm``: the fused residual add + RMSNorm + group quantization
(``rms_norm_quant`` with a residual, mn_tma scales, groups of 128) at M tokens from --m (default
1, 128, 2048, 4096, 16384) and H from --k (default 7168), against the copy bandwidth for the
bytes it must move (read x, residual and weight; write the residual, q and the scales) and beside
what it replaces:

- pair: fp8quant's unfused ops, ``rms_norm`` (residual form) then ``per_token_group_quant``;
- compiled reference: ``torch.compile`` of ``fp8quant.reference.rms_norm_quant`` (the same
  composition, fused as far as Inductor can), compiled once with dynamic shapes.

Same method as the other modes: CUDA graphs of N calls cycling through rotated buffer sets,
median of the replays. The residual is updated in place by every call, as in a model.
"""

from __future__ import annotations

import torch

from .. import reference
from ..layouts import scale_spec
from ..norm import rms_norm, rms_norm_quant
from ..quant import per_token_group_quant
from . import timing

__all__ = ["run_norm"]

SHAPES_M = (1, 128, 2048, 4096, 16384)
EPS = 1e-6
LAYOUT = "mn_tma"


def _compiled_reference():
    if not hasattr(_compiled_reference, "fn"):
        _compiled_reference.fn = torch.compile(
            lambda x, w, r: reference.rms_norm_quant(x, w, EPS, residual=r, scale_layout=LAYOUT), dynamic=True
        )
    return _compiled_reference.fn


def time_shape(m: int, h: int, dtype: torch.dtype, copy_gbps: float, rotation_bytes: int) -> list[timing.Result]:
    device = torch.device("cuda", torch.cuda.current_device())
    gen = torch.Generator(device=device).manual_seed(m)
    weight = (1 + 0.5 * torch.randn(h, generator=gen, device=device)).to(dtype)
    size = dtype.itemsize
    nbytes = 3 * m * h * size + h * size + m * h + 4 * scale_spec(LAYOUT, m, h // 128).numel

    def make_set():
        return (torch.randn(m, h, generator=gen, device=device).to(dtype),
                torch.randn(m, h, generator=gen, device=device).to(dtype))  # fmt: skip

    def pair(s):
        y, _ = rms_norm(s[0], weight, EPS, residual=s[1])
        return per_token_group_quant(y, 128, scale_layout=LAYOUT)

    results = timing.fused_and_chain(
        m, h, ("rms_norm_quant", "pair"),
        lambda s: rms_norm_quant(s[0], weight, EPS, residual=s[1], scale_layout=LAYOUT), pair,
        make_set, nbytes, 2 * m * h * size, copy_gbps, rotation_bytes, 2,
    )  # fmt: skip
    sets = [make_set() for _ in range(timing.rotation_sets(2 * m * h * size, rotation_bytes))]
    fn = _compiled_reference()
    calls = max(1, timing.graph_calls(len(sets), timing.estimated_call_us(nbytes, copy_gbps)) // 4)
    us = timing.time_graph(lambda i: fn(sets[i][0], weight, sets[i][1]), len(sets), calls)
    results.append(timing.Result(m, h, "compiled reference", us, nbytes, len(sets), calls))
    return results


def run_norm(args) -> int:
    if args.dtype not in ("bf16", "fp16"):
        raise SystemExit(f"--norm times bf16 or fp16 input (the RMSNorm kernels' dtypes), got --dtype {args.dtype}")
    return timing.run_shapes(
        args, [(m, args.k) for m in args.m or SHAPES_M], time_shape, refusal="--norm times the GPU kernels",
        labels=("M", "H"), op="residual add + RMSNorm + group quantization", rows="M",
        granularity="groups of 128, mn_tma scales, with a residual",
    )  # fmt: skip
