"""``python -m fp8quant bench --mx``: Blackwell's block-scaled quantizers on this GPU, at M tokens
from --m (default 1, 128, 2048, 4096, 16384, 32768) and K from --k (default 7168), against the
copy bandwidth for the bytes each must move (read x; write q and the whole scale buffer):

- ``mxfp8 rceil`` / ``mxfp8 floor``: :func:`fp8quant.mxfp8_quant`, swizzled scales;
- ``mxfp8 row``: the same with row-major scales;
- ``nvfp4``: :func:`fp8quant.nvfp4_quant` with its encode scale given (swizzled scales);
- ``nvfp4 + global amax``: the same computing the encode scale first (PyTorch ops);
- ``compiled reference``: ``torch.compile`` of ``fp8quant.reference.mxfp8_quant`` (row-major
  scales), what an engine without a kernel would run;
- the fused producers beside their unfused chains (the same bytes): ``rms_norm_nvfp4`` and
  ``rms_norm + nvfp4_quant`` (x [M, K], a weight [K]); ``silu_mul_mxfp8`` and
  ``silu_and_mul + mxfp8_quant`` (x [M, K] as [gate | up], outputs of K / 2 columns).

Issue 28's target: the quantizers at >= 90% of the copy bandwidth at M >= 2048, K = 7168. Same
method as the other modes: CUDA graphs of N calls over rotated buffer sets, median of replays.
"""

from __future__ import annotations

import torch

from .. import reference
from .._checks import NORM_MAX_H
from ..moe import silu_mul_mxfp8
from ..mx import mxfp8_quant, nvfp4_global_scale, nvfp4_quant
from ..norm import rms_norm, rms_norm_nvfp4
from ..reference.mx import swizzled_shape
from . import timing

__all__ = ["run_mx"]

SHAPES_M = (1, 128, 2048, 4096, 16384, 32768)


def _compiled_reference():
    if not hasattr(_compiled_reference, "fn"):
        _compiled_reference.fn = torch.compile(lambda x: reference.mxfp8_quant(x, scale_layout="row"), dynamic=True)
    return _compiled_reference.fn


def _scale_bytes(m: int, groups: int, swizzled: bool) -> int:
    rows, cols = swizzled_shape(m, groups) if swizzled else (m, groups)
    return rows * cols


def time_shape(m: int, k: int, dtype: torch.dtype, copy_gbps: float, rotation_bytes: int) -> list[timing.Result]:
    device = torch.device("cuda", torch.cuda.current_device())
    in_bytes = m * k * dtype.itemsize
    sets = [timing.random_input(m, k, dtype, device) for _ in range(timing.rotation_sets(in_bytes, rotation_bytes))]
    global_scale = nvfp4_global_scale(sets[0])
    cases = [
        ("mxfp8 rceil", lambda i: mxfp8_quant(sets[i]), m * k + _scale_bytes(m, k // 32, True)),
        ("mxfp8 floor", lambda i: mxfp8_quant(sets[i], recipe="floor"), m * k + _scale_bytes(m, k // 32, True)),
        ("mxfp8 row", lambda i: mxfp8_quant(sets[i], scale_layout="row"), m * k + _scale_bytes(m, k // 32, False)),
        ("nvfp4", lambda i: nvfp4_quant(sets[i], global_scale), m * k // 2 + _scale_bytes(m, k // 16, True)),
        ("nvfp4 + global amax", lambda i: nvfp4_quant(sets[i]), m * k // 2 + _scale_bytes(m, k // 16, True)),
    ]
    weight = timing.random_input(1, k, dtype, device).view(k)
    norm_out = m * k // 2 + _scale_bytes(m, k // 16, True)
    silu_out = m * k // 2 + _scale_bytes(m, k // 64, True)
    if dtype != torch.float32 and k <= NORM_MAX_H:  # the norm's rows
        cases += [
            ("rms_norm_nvfp4", lambda i: rms_norm_nvfp4(sets[i], weight, global_scale), k * dtype.itemsize + norm_out),
            ("rms_norm + nvfp4_quant", lambda i: nvfp4_quant(rms_norm(sets[i], weight), global_scale),
             k * dtype.itemsize + norm_out),
        ]  # fmt: skip
    cases += [
        ("silu_mul_mxfp8", lambda i: silu_mul_mxfp8(sets[i]), silu_out),
        ("silu_and_mul + mxfp8_quant", lambda i: mxfp8_quant(reference.silu_and_mul(sets[i])), silu_out),
    ]
    results = []
    for name, call, out_bytes in cases:
        nbytes = in_bytes + out_bytes
        calls = timing.graph_calls(len(sets), timing.estimated_call_us(nbytes, copy_gbps))
        us = timing.time_graph(call, len(sets), calls)
        results.append(timing.Result(m, k, name, us, nbytes, len(sets), calls))
    fn = _compiled_reference()
    nbytes = in_bytes + m * k + _scale_bytes(m, k // 32, False)
    calls = max(1, timing.graph_calls(len(sets), timing.estimated_call_us(nbytes, copy_gbps)) // 4)
    results.append(timing.Result(m, k, "compiled reference", timing.time_graph(lambda i: fn(sets[i]), len(sets), calls),
                                 nbytes, len(sets), calls))  # fmt: skip
    return results


def run_mx(args) -> int:
    return timing.run_shapes(
        args, [(m, args.k) for m in args.m or SHAPES_M], time_shape, refusal="--mx times the GPU kernels",
        labels=("M", "K"), op="MXFP8 and NVFP4 quantization", rows="M",
        granularity="MXFP8 groups of 32 (E8M0), NVFP4 groups of 16 (e4m3 scales, float32 encode scale)",
    )  # fmt: skip
