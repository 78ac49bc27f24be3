"""MXFP8, Blackwell's microscaled FP8 (docs/contract.md, "MXFP8"): the public op, declared once
(``fp8quant._ops.Op``), and its CUDA launch. Groups of 32 along the last dimension, e4m3 values,
one E8M0 scale byte per group, swizzled for the block-scaled tensor cores by default."""

from __future__ import annotations

import torch

from . import reference
from ._checks import FP8_DTYPE, _check_input, _check_last_dim
from ._ext import extension as _extension
from ._ext import launch_rows
from ._ops import Buffer, Op, TensorMeta
from .reference.mx import MX_GROUP, MX_RECIPES, MX_SCALE_LAYOUTS, mxfp8_dequant, swizzled_shape

__all__ = ["MX_RECIPES", "MX_SCALE_LAYOUTS", "mxfp8_dequant", "mxfp8_quant"]

_LAYOUT_CODES = {"row": 0, "swizzled": 1}  # fp8quant_mx_scale_layout_t
_RECIPE_CODES = {"rceil": 0, "floor": 1}  # fp8quant_mx_recipe_t
_E8M0 = torch.float8_e8m0fnu


def _geometry(x: TensorMeta, recipe: str, scale_layout: str) -> tuple[Buffer, Buffer]:
    """q like x (row-major, any row and batch strides with ``out=``); the scale bytes, contiguous."""
    *batch, m, k = x.shape
    rows, cols = (m, k // MX_GROUP) if scale_layout == "row" else swizzled_shape(m, k // MX_GROUP)
    shape = (*batch, rows, cols)
    stride, numel = [], 1
    for size in reversed(shape):
        stride.insert(0, numel)
        numel *= size
    scale = Buffer(_E8M0, shape, tuple(stride), numel, "(the whole MX scale buffer, contiguous)", full_shape=shape)
    return Buffer(FP8_DTYPE, x.shape), scale


def _launch(x: torch.Tensor, q: torch.Tensor, scale: torch.Tensor, recipe: str, scale_layout: str) -> None:
    """Enqueue the kernel on x's device and current stream; the C API checks every value."""
    launch_rows(
        _extension().mxfp8_quant_ptr, x, q, scale.data_ptr(), _LAYOUT_CODES[scale_layout], _RECIPE_CODES[recipe]
    )


def _reference(x: torch.Tensor, recipe: str, scale_layout: str):
    return reference.mxfp8_quant(x, recipe=recipe, scale_layout=scale_layout)


_quant = Op("mxfp8_quant", ("q", "scale"), _geometry, _launch, _reference)


def mxfp8_quant(
    x: torch.Tensor,
    *,
    recipe: str = "rceil",
    scale_layout: str = "swizzled",
    out: tuple[torch.Tensor, torch.Tensor] | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Quantize ``x [M, K]`` or ``[B, M, K]`` to MXFP8: groups of 32 along K, one E8M0 scale byte
    each (docs/contract.md, "MXFP8").

    Args:
        x: bfloat16, float16 or float32, last dimension contiguous, K a positive multiple of 32.
        recipe: ``"rceil"`` (NVIDIA's: the smallest power of two at or above amax / 448) or
            ``"floor"`` (the OCP MX specification's).
        scale_layout: ``"swizzled"`` (what Blackwell's block-scaled GEMMs read: per batch a
            ``[round_up(M, 128), round_up(K / 32, 4)]`` byte matrix, padding 0) or ``"row"``
            (``[*, M, K / 32]``).
        out: optional ``(q, scale)`` of exactly the shapes and dtypes returned.

    Returns:
        ``(q, scale)``: ``q`` float8_e4m3fn like x, ``scale`` float8_e8m0fnu.

    Example::

        q, scale = fp8quant.mxfp8_quant(x)             # for torch._scaled_mm / cuBLASLt MXFP8
    """
    _check_input(x, "x", "2-D [M, K] or 3-D [B, M, K]")
    k = x.shape[-1]
    if k == 0 or k % MX_GROUP:
        raise ValueError(f"x.shape[-1] (K={k}) must be a positive multiple of {MX_GROUP}")
    _check_last_dim(x, "x")
    if recipe not in MX_RECIPES:
        raise ValueError(f"recipe must be one of {MX_RECIPES}, got {recipe!r}")
    if scale_layout not in MX_SCALE_LAYOUTS:
        raise ValueError(f"scale_layout must be one of {MX_SCALE_LAYOUTS}, got {scale_layout!r}")
    return _quant(x, recipe, scale_layout, out=out)
