"""Blackwell's block-scaled formats (docs/contract.md, "MXFP8" and "NVFP4"): the public ops,
declared once each (``fp8quant._ops.Op``), and their CUDA launch. MXFP8: groups of 32, e4m3
values, one E8M0 scale byte per group. NVFP4: groups of 16, e2m1 values two to a byte, one e4m3
scale byte per group, times a float32 encode scale per tensor or per expert. Scales are swizzled
for the block-scaled tensor cores by default."""

from __future__ import annotations

import torch

from . import reference
from ._checks import FP8_DTYPE, check_block_rows
from ._ext import extension as _extension
from ._ext import launch_rows
from ._ops import Buffer, Op, TensorMeta
from .reference.mx import MX_GROUP, MX_RECIPES, MX_SCALE_LAYOUTS, mxfp8_dequant, swizzled_shape
from .reference.nvfp4 import NVFP4_GROUP, nvfp4_dequant, nvfp4_global_scale

__all__ = [
    "MX_RECIPES",
    "MX_SCALE_LAYOUTS",
    "mxfp8_dequant",
    "mxfp8_quant",
    "nvfp4_dequant",
    "nvfp4_global_scale",
    "nvfp4_quant",
]

_LAYOUT_CODES = {"row": 0, "swizzled": 1}  # fp8quant_mx_scale_layout_t
_RECIPE_CODES = {"rceil": 0, "floor": 1}  # fp8quant_mx_recipe_t
_E8M0 = torch.float8_e8m0fnu


def _check_block_input(x: torch.Tensor, group: int, scale_layout: str, shapes: str) -> None:
    """What both ops need of x (check_block_rows) and the layout (one of MX_SCALE_LAYOUTS)."""
    check_block_rows(x, group, shapes)
    if scale_layout not in MX_SCALE_LAYOUTS:
        raise ValueError(f"scale_layout must be one of {MX_SCALE_LAYOUTS}, got {scale_layout!r}")


def _scale_buffer(x: TensorMeta, group: int, scale_layout: str, dtype: torch.dtype) -> Buffer:
    """The scale bytes of x's groups in ``scale_layout``: one contiguous buffer, padding included."""
    *batch, m, k = x.shape
    rows, cols = (m, k // group) if scale_layout == "row" else swizzled_shape(m, k // group)
    return Buffer.contiguous(dtype, (*batch, rows, cols), "(the whole scale buffer, contiguous)")


def _geometry(x: TensorMeta, recipe: str, scale_layout: str) -> tuple[Buffer, Buffer]:
    """q like x (row-major, any row and batch strides with ``out=``); the scale bytes."""
    return Buffer(FP8_DTYPE, x.shape), _scale_buffer(x, MX_GROUP, scale_layout, _E8M0)


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
    _check_block_input(x, MX_GROUP, scale_layout, "2-D [M, K] or 3-D [B, M, K]")
    if recipe not in MX_RECIPES:
        raise ValueError(f"recipe must be one of {MX_RECIPES}, got {recipe!r}")
    return _quant(x, recipe, scale_layout, out=out)


# --- NVFP4 ---------------------------------------------------------------------------------------


def _fp4_geometry(x: TensorMeta, global_scale: TensorMeta, scale_layout: str) -> tuple[Buffer, Buffer]:
    """q [*, M, K / 2] bytes (row-major, any row and batch strides with ``out=``); the scale bytes."""
    return Buffer(torch.uint8, (*x.shape[:-1], x.shape[-1] // 2)), _scale_buffer(x, NVFP4_GROUP, scale_layout,
                                                                                  FP8_DTYPE)  # fmt: skip


def _fp4_launch(x, global_scale, q, scale, scale_layout: str) -> None:
    """Enqueue the kernel on x's device and current stream; the C API checks every value."""
    launch_rows(_extension().nvfp4_quant_ptr, x, q, scale.data_ptr(), _LAYOUT_CODES[scale_layout],
                global_scale.data_ptr(), global_scale.dim() == 1)  # fmt: skip


def _fp4_reference(x: torch.Tensor, global_scale: torch.Tensor, scale_layout: str):
    return reference.nvfp4_quant(x, global_scale, scale_layout=scale_layout)[:2]


_fp4 = Op("nvfp4_quant", ("q", "scale"), _fp4_geometry, _fp4_launch, _fp4_reference)


def nvfp4_quant(
    x: torch.Tensor,
    global_scale: torch.Tensor | None = None,
    *,
    scale_layout: str = "swizzled",
    out: tuple[torch.Tensor, torch.Tensor] | None = None,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Quantize ``x [M, K]`` or ``[E, M, K]`` to NVFP4: groups of 16 along K, e2m1 values two to a
    byte, one e4m3 scale per group, every division IEEE (docs/contract.md, "NVFP4").

    Args:
        x: bfloat16, float16 or float32, last dimension contiguous, K a positive multiple of 16.
        global_scale: the float32 encode scale ``S`` on x's device: ``[]`` for the tensor, or
            ``[E]`` for a 3-D x (one per expert); by default :func:`nvfp4_global_scale` of x
            (``448 * 6 / amax``, computed with PyTorch ops).
        scale_layout: ``"swizzled"`` (what Blackwell's block-scaled GEMMs read) or ``"row"``.
        out: optional ``(q, scale)`` of exactly the shapes and dtypes returned.

    Returns:
        ``(q, scale, global_scale)``: ``q`` uint8 ``[*, M, K / 2]`` (element 2i in the low nibble
        of byte i), ``scale`` float8_e4m3fn, and the encode scale used (dequantize with
        ``value * scale / global_scale``).

    Example::

        q, scale, s_enc = fp8quant.nvfp4_quant(x)
    """
    _check_block_input(x, NVFP4_GROUP, scale_layout, "2-D [M, K] or 3-D [E, M, K]")
    if global_scale is None:
        global_scale = nvfp4_global_scale(x)
    per_batch = (x.shape[0],) if x.dim() == 3 else None
    if (
        not isinstance(global_scale, torch.Tensor)
        or global_scale.dtype != torch.float32
        or global_scale.device != x.device
        or tuple(global_scale.shape) not in ((), per_batch)
    ):
        want = "[]" + (f" or [{x.shape[0]}]" if per_batch else "")
        raise ValueError(f"global_scale must be a float32 tensor {want} on {x.device}, got "
                         f"{getattr(global_scale, 'dtype', type(global_scale).__name__)} "
                         f"{tuple(getattr(global_scale, 'shape', ()))}")  # fmt: skip
    global_scale = global_scale.contiguous()
    q, scale = _fp4(x, global_scale, scale_layout, out=out)
    return q, scale, global_scale
