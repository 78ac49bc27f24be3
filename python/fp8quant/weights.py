"""Weights (SPEC.md section 3), each op declared once (``fp8quant._ops.Op``) with its CUDA launch:
per_block_quant, FP8 quantization in 128 x 128 blocks with one fp32 scale each, and
requantize_ue8m0, an fp8 checkpoint weight re-quantized with power-of-two scales."""

from __future__ import annotations

import torch

from . import reference
from ._checks import FP8_DTYPE, check_block_limits, check_block_quant_args, check_eps
from ._ext import extension, launch_rows
from ._ops import Buffer, Op, TensorMeta

__all__ = ["per_block_quant", "requantize_ue8m0"]


def _geometry(w: TensorMeta, block_n: int, block_k: int, ue8m0: bool, eps: float) -> tuple[Buffer, Buffer]:
    """q like w; fp32 scales [*, ceil(N / block_n), ceil(K / block_k)], contiguous."""
    n, k = w.shape[-2], w.shape[-1]
    shape = (*w.shape[:-2], -(-n // block_n), -(-k // block_k))
    return Buffer(FP8_DTYPE, w.shape), Buffer.contiguous(torch.float32, shape, "(contiguous block scales)")


def _launch(w, q, scale, block_n: int, block_k: int, ue8m0: bool, eps: float) -> None:
    """Enqueue the kernel on w's device and current stream; the C API checks every value."""
    launch_rows(extension().per_block_quant_ptr, w, q, scale.data_ptr(), block_n, block_k, ue8m0, eps)


def _reference(w: torch.Tensor, block_n: int, block_k: int, ue8m0: bool, eps: float):
    return reference.per_block_quant(w, (block_n, block_k), ue8m0=ue8m0, eps=eps)


_block_quant = Op("per_block_quant", ("q", "scale"), _geometry, _launch, _reference)


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
        block_size: ``(block_n, block_k)``: ``(128, 128)`` (DeepSeek-V3's and DeepGEMM's), the
            kernel's, on either device (:func:`fp8quant.reference.per_block_quant` takes any).
            Edge blocks may be partial.
        ue8m0: round each scale up to a power of two and quantize the block with it.
        eps: lower bound of each block's amax (DeepGEMM uses 1e-4).
        out: optional ``(q, scale)`` to write into: q with w's shape (rows may be strided), the
            scales contiguous.

    Returns:
        ``(q, scale)``: q float8_e4m3fn with w's shape; scale fp32 ``[*, ceil(N/bn), ceil(K/bk)]``
        (DeepSeek-V3's ``weight_scale_inv``: ``w ≈ q * scale`` block by block).

    Example::

        w_q, w_s = fp8quant.per_block_quant(w)   # w [N, K] bf16 on the GPU
        # ceil(K / 128) a multiple of 4 (docs/backends.md: cuBLASLt misreads w_s otherwise);
        # fp8quant.linear prepares the weight for any K
        y = torch._scaled_mm(a_q, w_q.t(), a_s, w_s.t(), out_dtype=torch.bfloat16)
    """
    check_block_quant_args(w, block_size, ue8m0, eps)
    check_block_limits(block_size)
    return _block_quant(w, block_size[0], block_size[1], ue8m0, float(eps), out=out)


def _requantize_geometry(
    w: TensorMeta, w_scale: TensorMeta, block_n: int, block_k: int, eps: float
) -> tuple[Buffer, Buffer]:
    return _geometry(w, block_n, block_k, True, eps)


def _requantize_launch(w, w_scale, q, scale, block_n: int, block_k: int, eps: float) -> None:
    launch_rows(
        extension().requantize_ue8m0_ptr, w, q, w_scale.data_ptr(), scale.data_ptr(), block_n, block_k, eps,
        dtype_code=False,
    )  # fmt: skip


def _requantize_reference(w: torch.Tensor, w_scale: torch.Tensor, block_n: int, block_k: int, eps: float):
    return reference.requantize_ue8m0(w, w_scale, (block_n, block_k), eps=eps)


_requantize = Op("requantize_ue8m0", ("q", "scale"), _requantize_geometry, _requantize_launch, _requantize_reference)


def requantize_ue8m0(
    w: torch.Tensor,
    w_scale: torch.Tensor,
    block_size: tuple[int, int] = (128, 128),
    *,
    eps: float = 1e-4,
    out: tuple[torch.Tensor, torch.Tensor] | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Re-quantize an fp8 weight with power-of-two block scales (for DeepGEMM on Blackwell).

    Each element is dequantized as ``bfloat16(w * w_scale)`` (the float32 product rounded to
    nearest even), then each block is quantized as ``per_block_quant(..., ue8m0=True)`` does; this
    is the procedure SGLang and vLLM apply to DeepSeek-V3 checkpoints. A block whose scale was
    already a power of two keeps its values exactly.

    Args:
        w: float8_e4m3fn ``[N, K]`` or ``[E, N, K]``, last dimension contiguous (a checkpoint's
            ``weight``).
        w_scale: its fp32 block scales ``[*, ceil(N/bn), ceil(K/bk)]``, contiguous (the
            checkpoint's ``weight_scale_inv``).
        block_size: ``(128, 128)``, the kernel's, on either device
            (:func:`fp8quant.reference.requantize_ue8m0` takes any).
        eps: lower bound of each block's amax.
        out: optional ``(q, scale)`` to write into, as for :func:`per_block_quant`.

    Returns:
        ``(q, scale)``: float8_e4m3fn like ``w`` and power-of-two fp32 scales like ``w_scale``.

    Example::

        w_q, w_s = fp8quant.requantize_ue8m0(ckpt["weight"], ckpt["weight_scale_inv"])
        w_s_sm100 = fp8quant.sm100_weight_scales(w_s, w_q.shape[-2])
    """
    if not isinstance(w, torch.Tensor) or w.dtype != FP8_DTYPE or w.dim() not in (2, 3):
        raise TypeError("w must be a float8_e4m3fn tensor [N, K] or [E, N, K]")
    if w.numel() > 0 and w.stride(-1) != 1:
        raise ValueError(f"w must have a contiguous last dimension, got strides {tuple(w.stride())}")
    if not (
        isinstance(block_size, (tuple, list))
        and len(block_size) == 2
        and all(isinstance(b, int) and not isinstance(b, bool) and b > 0 for b in block_size)
    ):
        raise ValueError(f"block_size must be a pair of positive ints (block_n, block_k), got {block_size!r}")
    check_block_limits(block_size)
    check_eps(eps)
    bn, bk = block_size
    want = (*w.shape[:-2], -(-w.shape[-2] // bn), -(-w.shape[-1] // bk))
    if not isinstance(w_scale, torch.Tensor) or w_scale.dtype != torch.float32 or tuple(w_scale.shape) != want:
        got = f"{w_scale.dtype} {tuple(w_scale.shape)}" if isinstance(w_scale, torch.Tensor) else type(w_scale).__name__
        raise ValueError(
            f"w_scale must be float32 of shape {want} for w {tuple(w.shape)} and blocks {tuple(block_size)}, got {got}"
        )
    if not w_scale.is_contiguous():
        raise ValueError(f"w_scale must be contiguous, got strides {tuple(w_scale.stride())}")
    if w_scale.device != w.device:
        raise ValueError(f"w_scale is on {w_scale.device}, w on {w.device}: all tensors must be on one device")
    return _requantize(w, w_scale, bn, bk, float(eps), out=out)
