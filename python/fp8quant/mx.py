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

MX_LAYOUT_CODES = {"row": 0, "swizzled": 1}  # fp8quant_mx_scale_layout_t
MX_RECIPE_CODES = {"rceil": 0, "floor": 1}  # fp8quant_mx_recipe_t
_E8M0 = torch.float8_e8m0fnu


def check_mx_options(scale_layout: str, recipe: str | None = None) -> None:
    """``scale_layout`` one of MX_SCALE_LAYOUTS and, where given, ``recipe`` one of MX_RECIPES."""
    if scale_layout not in MX_SCALE_LAYOUTS:
        raise ValueError(f"scale_layout must be one of {MX_SCALE_LAYOUTS}, got {scale_layout!r}")
    if recipe is not None and recipe not in MX_RECIPES:
        raise ValueError(f"recipe must be one of {MX_RECIPES}, got {recipe!r}")


def check_global_scale(global_scale, device: torch.device, shapes: tuple[tuple, ...]) -> torch.Tensor:
    """NVFP4's encode scale: a float32 tensor on ``device`` of one of ``shapes``, returned contiguous."""
    if (
        not isinstance(global_scale, torch.Tensor)
        or global_scale.dtype != torch.float32
        or global_scale.device != device
        or tuple(global_scale.shape) not in shapes
    ):
        want = " or ".join(f"[{', '.join(map(str, s))}]" for s in shapes)
        raise ValueError(f"global_scale must be a float32 tensor {want} on {device}, got "
                         f"{getattr(global_scale, 'dtype', type(global_scale).__name__)} "
                         f"{tuple(getattr(global_scale, 'shape', ()))}")  # fmt: skip
    return global_scale.contiguous()


def block_scaled_outputs(shape: tuple, fmt: str, scale_layout: str) -> tuple[Buffer, Buffer]:
    """The outputs of a quantization of values ``shape [*, M, K]`` to ``fmt`` (``"mxfp8"`` or
    ``"nvfp4"``): q (float8_e4m3fn like the values, or uint8 ``[*, M, K / 2]``; row-major, any row
    and batch strides with ``out=``) and the scale bytes in ``scale_layout``, one contiguous buffer
    with its padding."""
    *batch, m, k = shape
    fp4 = fmt == "nvfp4"
    num_groups = k // (NVFP4_GROUP if fp4 else MX_GROUP)
    rows, cols = (m, num_groups) if scale_layout == "row" else swizzled_shape(m, num_groups)
    q = Buffer(torch.uint8, (*batch, m, k // 2)) if fp4 else Buffer(FP8_DTYPE, tuple(shape))
    scale = Buffer.contiguous(FP8_DTYPE if fp4 else _E8M0, (*batch, rows, cols), "(the whole scale buffer, contiguous)")
    return q, scale


def _geometry(x: TensorMeta, recipe: str, scale_layout: str) -> tuple[Buffer, Buffer]:
    return block_scaled_outputs(x.shape, "mxfp8", scale_layout)


def _launch(x: torch.Tensor, q: torch.Tensor, scale: torch.Tensor, recipe: str, scale_layout: str) -> None:
    """Enqueue the kernel on x's device and current stream; the C API checks every value."""
    launch_rows(
        _extension().mxfp8_quant_ptr, x, q, scale.data_ptr(), MX_LAYOUT_CODES[scale_layout], MX_RECIPE_CODES[recipe]
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
    check_block_rows(x, MX_GROUP, "2-D [M, K] or 3-D [B, M, K]")
    check_mx_options(scale_layout, recipe)
    return _quant(x, recipe, scale_layout, out=out)


# --- NVFP4 ---------------------------------------------------------------------------------------


def _fp4_geometry(x: TensorMeta, global_scale: TensorMeta, scale_layout: str) -> tuple[Buffer, Buffer]:
    return block_scaled_outputs(x.shape, "nvfp4", scale_layout)


def _fp4_launch(x, global_scale, q, scale, scale_layout: str) -> None:
    """Enqueue the kernel on x's device and current stream; the C API checks every value."""
    launch_rows(_extension().nvfp4_quant_ptr, x, q, scale.data_ptr(), MX_LAYOUT_CODES[scale_layout],
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
    check_block_rows(x, NVFP4_GROUP, "2-D [M, K] or 3-D [E, M, K]")
    check_mx_options(scale_layout)
    if global_scale is None:
        global_scale = nvfp4_global_scale(x)
    global_scale = check_global_scale(global_scale, x.device, ((), (x.shape[0],)) if x.dim() == 3 else ((),))
    q, scale = _fp4(x, global_scale, scale_layout, out=out)
    return q, scale, global_scale
