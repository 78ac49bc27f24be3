"""Mixture-of-experts ops around the grouped GEMMs (docs/contract.md, "MoE"), declared once each
(``fp8quant._ops.Op``) with their CUDA launch. This module has the combine step; routing,
dispatch + quantize and SiLU-and-mul + quantize have references in :mod:`fp8quant.reference`
and kernels to come."""

from __future__ import annotations

import torch

from . import reference
from ._checks import INPUT_DTYPES
from ._ext import DTYPE_CODES, extension, launch
from ._ops import Buffer, Op, TensorMeta

__all__ = ["moe_combine"]


def _combine_geometry(y: TensorMeta, rows: TensorMeta, weights: TensorMeta) -> tuple[Buffer]:
    """out [T, H] of y's dtype, row-major (any row stride with out=)."""
    return (Buffer(y.dtype, (rows.shape[0], y.shape[-1])),)


def _combine_launch(y, rows, weights, out) -> None:
    """Enqueue the kernel on y's device and current stream; the C API checks every value."""
    h = y.shape[-1]
    y_rows = y.numel() // h if h else 0
    launch(
        extension().moe_combine_ptr, y.get_device(), y.data_ptr(), DTYPE_CODES[y.dtype], y_rows, h, y.stride(-2),
        rows.data_ptr(), weights.data_ptr(), rows.shape[0], rows.shape[1], out.data_ptr(), out.stride(0),
    )  # fmt: skip


_combine = Op(
    "moe_combine",
    inputs=("y", "rows", "weights"),
    params="",
    outputs=("out",),
    geometry=_combine_geometry,
    launch=_combine_launch,
    reference=lambda y, rows, weights: (reference.moe_combine(y, rows, weights),),
)


def moe_combine(
    y: torch.Tensor, rows: torch.Tensor, weights: torch.Tensor, *, out: torch.Tensor | None = None
) -> torch.Tensor:
    """Each token's expert outputs, weighted by the router and summed:
    ``out[t] = sum_j weights[t, j] * y[rows[t, j]]`` in float32, in slot order, rounded once to
    y's dtype.

    Args:
        y: expert outputs, bfloat16, float16 or float32 with a contiguous last dimension: the
            contiguous layout's ``[M_sum, H]``, or the masked layout's ``[E, max_m, H]`` (its
            rows must be evenly spaced: ``stride(0) == max_m * stride(1)``).
        rows: int32 ``[T, k]``, contiguous: ``routing.inv_perm`` (contiguous layout) or
            ``routing.masked_row`` (masked). A row outside y (the -1 of a dropped slot)
            contributes nothing.
        weights: float32 ``[T, k]``, contiguous: the router's top-k weights.
        out: optional ``[T, H]`` of y's dtype to write into (any row stride).

    Returns:
        ``[T, H]`` of y's dtype.

    Example::

        routing = fp8quant.reference.moe_routing(topk_ids, num_experts)
        out = fp8quant.moe_combine(expert_out, routing.inv_perm, topk_weights)
    """
    if not isinstance(y, torch.Tensor) or y.dtype not in INPUT_DTYPES or y.dim() not in (2, 3):
        raise TypeError("y must be a bfloat16, float16 or float32 tensor [M_sum, H] or [E, max_m, H]")
    if y.numel() > 0 and y.stride(-1) != 1:
        raise ValueError(f"y must have a contiguous last dimension, got strides {tuple(y.stride())}")
    if y.dim() == 3 and y.shape[0] > 1 and y.shape[1] > 0 and y.stride(0) != y.shape[1] * y.stride(1):
        raise ValueError(f"y [E, max_m, H] must have evenly spaced rows (stride(0) == max_m * stride(1)), got strides {tuple(y.stride())}")
    if not isinstance(rows, torch.Tensor) or rows.dtype != torch.int32 or rows.dim() != 2 or not rows.is_contiguous():
        raise TypeError("rows must be a contiguous int32 tensor [T, k]")
    if not isinstance(weights, torch.Tensor) or weights.dtype != torch.float32 or not weights.is_contiguous():
        raise TypeError("weights must be a contiguous float32 tensor [T, k]")
    if weights.shape != rows.shape:
        raise ValueError(f"weights must have the shape of rows {tuple(rows.shape)}, got {tuple(weights.shape)}")
    if rows.shape[1] < 1:
        raise ValueError("rows must have at least one slot per token (k >= 1)")
    for name, t in (("rows", rows), ("weights", weights)):
        if t.device != y.device:
            raise ValueError(f"{name} is on {t.device}, y on {y.device}: all tensors must be on one device")
    (result,) = _combine(y, rows, weights, out=None if out is None else (out,))
    return result
