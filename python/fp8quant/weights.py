"""per_block_quant: FP8 quantization of weights in 128 x 128 blocks, one fp32 scale each (SPEC.md
section 3), declared once (``fp8quant._ops.Op``), with its CUDA launch."""

from __future__ import annotations

import torch

from . import reference
from ._checks import FP8_DTYPE, check_block_quant_args
from ._ext import extension, launch_rows
from ._ops import Buffer, Op, TensorMeta

__all__ = ["per_block_quant"]


def _geometry(w: TensorMeta, block_n: int, block_k: int, ue8m0: bool, eps: float) -> tuple[Buffer, Buffer]:
    """q like w; fp32 scales [*, ceil(N / block_n), ceil(K / block_k)], contiguous."""
    n, k = w.shape[-2], w.shape[-1]
    shape = (*w.shape[:-2], -(-n // block_n), -(-k // block_k))
    stride, numel = [], 1
    for size in reversed(shape):
        stride.insert(0, numel)
        numel *= size
    return Buffer(FP8_DTYPE, w.shape), Buffer(
        torch.float32, shape, tuple(stride), numel, "(contiguous block scales)", full_shape=shape
    )


def _launch(w, q, scale, block_n: int, block_k: int, ue8m0: bool, eps: float) -> None:
    """Enqueue the kernel on w's device and current stream; the C API checks every value."""
    launch_rows(extension().per_block_quant_ptr, w, q, scale.data_ptr(), block_n, block_k, ue8m0, eps)


def _reference(w, block_n, block_k, ue8m0, eps):
    return reference.per_block_quant(w, (block_n, block_k), ue8m0=ue8m0, eps=eps)


_block_quant = Op(
    "per_block_quant",
    inputs=("w",),
    params="int block_n, int block_k, bool ue8m0, float eps",
    outputs=("q", "scale"),
    geometry=_geometry,
    launch=_launch,
    reference=_reference,
)


def per_block_quant(
    w: torch.Tensor,
    block_size: tuple[int, int] = (128, 128),
    *,
    ue8m0: bool = False,
    eps: float = 1e-4,
    out: tuple[torch.Tensor, torch.Tensor] | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Quantize a weight ``w`` to float8_e4m3fn in blocks, one fp32 scale per block.

    Args:
        w: ``[N, K]`` or ``[E, N, K]`` (one weight per expert) bfloat16, float16 or float32, last
            dimension contiguous. CUDA tensors run the kernel; CPU tensors run the reference.
        block_size: ``(block_n, block_k)``; the kernel takes ``(128, 128)`` (DeepSeek-V3's and
            DeepGEMM's), the CPU reference any. Edge blocks may be partial.
        ue8m0: round each scale up to a power of two and quantize the block with it.
        eps: lower bound of each block's amax (DeepGEMM uses 1e-4).
        out: optional ``(q, scale)`` to write into: q with w's shape (rows may be strided), the
            scales contiguous.

    Returns:
        ``(q, scale)``: q float8_e4m3fn with w's shape; scale fp32 ``[*, ceil(N/bn), ceil(K/bk)]``
        (DeepSeek-V3's ``weight_scale_inv``: ``w ≈ q * scale`` block by block).

    Example::

        w_q, w_s = fp8quant.per_block_quant(w)   # w [N, K] bf16 on the GPU
        y = torch._scaled_mm(a_q, w_q.t(), a_s, w_s.t(), out_dtype=torch.bfloat16)
    """
    check_block_quant_args(w, block_size, ue8m0, eps)
    return _block_quant(w, block_size[0], block_size[1], ue8m0, float(eps), out=out)
