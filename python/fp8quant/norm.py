"""RMSNorm, after an optional residual add, written in the input's dtype (:func:`rms_norm`) or
quantized in the same pass: to FP8 in groups (:func:`rms_norm_quant`), to MXFP8
(:func:`rms_norm_mxfp8`) or to NVFP4 (:func:`rms_norm_nvfp4`). Each op is declared once
(``fp8quant._ops.Op``), without and with the residual, which the kernel updates in place.
Numerics: docs/contract.md, "RMSNorm"."""

from __future__ import annotations

import torch

from . import reference
from ._checks import FP8_DTYPE, NORM_MAX_H, check_norm_args, check_quant_args, resolve_ue8m0
from ._ext import DTYPE_CODES, LAYOUT_CODES, extension, launch
from ._ops import Buffer, Op, TensorMeta
from .layouts import scale_buffer
from .mx import MX_LAYOUT_CODES, MX_RECIPE_CODES, block_scaled_outputs, check_global_scale, check_mx_options
from .reference.mx import MX_GROUP
from .reference.nvfp4 import NVFP4_GROUP

__all__ = ["rms_norm", "rms_norm_mxfp8", "rms_norm_nvfp4", "rms_norm_quant"]


# --- the ops ---------------------------------------------------------------------------------------


def _norm_geometry(x: TensorMeta, *rest) -> tuple[Buffer]:
    """y like x (with out=, any row stride the C API takes: 16-byte aligned rows)."""
    return (Buffer(x.dtype, x.shape),)


def _quant_geometry(x: TensorMeta, *rest) -> tuple[Buffer, Buffer]:
    """q like x; the scale layout's buffer for H / group_size groups."""
    group_size, scale_layout = rest[-4], rest[-3]
    return Buffer(FP8_DTYPE, x.shape), scale_buffer(scale_layout, x.shape[0], x.shape[1] // group_size, ())


def _row_args(x, residual, weight, eps) -> tuple:
    """The arguments both C functions start with: x, the residual (0 without one), the weight,
    the dtype, M, H, the row strides and eps."""
    return (
        x.data_ptr(), 0 if residual is None else residual.data_ptr(), weight.data_ptr(), DTYPE_CODES[x.dtype],
        x.shape[0], x.shape[1], x.stride(0), 0 if residual is None else residual.stride(0), eps,
    )  # fmt: skip


def _launch_norm(x, residual, weight, y, eps) -> None:
    launch(extension().rms_norm_ptr, x.get_device(), *_row_args(x, residual, weight, eps), y.data_ptr(), y.stride(0))


def _launch_quant(x, residual, weight, q, scale, eps, group_size, scale_layout, ue8m0, quant_eps) -> None:
    launch(
        extension().rms_norm_quant_ptr, x.get_device(), *_row_args(x, residual, weight, eps), q.data_ptr(), q.stride(0),
        scale.data_ptr(), LAYOUT_CODES[scale_layout], ue8m0, group_size, quant_eps,
    )  # fmt: skip


def _norm_reference(x: torch.Tensor, weight: torch.Tensor, eps: float):
    return (reference.rms_norm(x, weight, eps),)


def _add_norm_reference(x: torch.Tensor, residual: torch.Tensor, weight: torch.Tensor, eps: float):
    return reference.rms_norm(x, weight, eps, residual=residual)


def _norm_quant_reference(
    x: torch.Tensor, weight: torch.Tensor, eps: float, group_size: int, scale_layout: str, ue8m0: bool, quant_eps: float
):  # fmt: skip
    return reference.rms_norm_quant(x, weight, eps, group_size=group_size, scale_layout=scale_layout, ue8m0=ue8m0,
                                    quant_eps=quant_eps)  # fmt: skip


def _add_norm_quant_reference(
    x: torch.Tensor, residual: torch.Tensor, weight: torch.Tensor, eps: float, group_size: int, scale_layout: str, ue8m0: bool, quant_eps: float
):  # fmt: skip
    return reference.rms_norm_quant(x, weight, eps, residual=residual, group_size=group_size, scale_layout=scale_layout,
                                    ue8m0=ue8m0, quant_eps=quant_eps)  # fmt: skip


def _launch_norm_alone(x, weight, y, eps) -> None:
    _launch_norm(x, None, weight, y, eps)


def _launch_quant_alone(x, weight, q, scale, *params) -> None:
    _launch_quant(x, None, weight, q, scale, *params)


# Without and with the residual, which the kernels update in place
_norm = Op("rms_norm", ("y",), _norm_geometry, _launch_norm_alone, _norm_reference)
_add_norm = Op("add_rms_norm", ("y",), _norm_geometry, _launch_norm, _add_norm_reference, mutates=("residual",))
_norm_quant = Op("rms_norm_quant", ("q", "scale"), _quant_geometry, _launch_quant_alone, _norm_quant_reference)
_add_norm_quant = Op(
    "add_rms_norm_quant",
    ("q", "scale"),
    _quant_geometry,
    _launch_quant,
    _add_norm_quant_reference,
    mutates=("residual",),
)


# Quantized to MXFP8 or NVFP4 (the encode scale an input), without and with the residual


def _mx_geometry(x: TensorMeta, *rest) -> tuple[Buffer, Buffer]:
    return block_scaled_outputs(x.shape, "mxfp8", rest[-1])


def _fp4_geometry(x: TensorMeta, *rest) -> tuple[Buffer, Buffer]:
    return block_scaled_outputs(x.shape, "nvfp4", rest[-1])


def _launch_mx(x, residual, weight, q, scale, eps, recipe, scale_layout) -> None:
    launch(
        extension().rms_norm_mxfp8_ptr, x.get_device(), *_row_args(x, residual, weight, eps), q.data_ptr(),
        q.stride(0), scale.data_ptr(), MX_LAYOUT_CODES[scale_layout], MX_RECIPE_CODES[recipe],
    )  # fmt: skip


def _launch_fp4(x, residual, weight, global_scale, q, scale, eps, scale_layout) -> None:
    launch(
        extension().rms_norm_nvfp4_ptr, x.get_device(), *_row_args(x, residual, weight, eps), q.data_ptr(),
        q.stride(0), scale.data_ptr(), MX_LAYOUT_CODES[scale_layout], global_scale.data_ptr(),
    )  # fmt: skip


def _mx_reference(x: torch.Tensor, weight: torch.Tensor, eps: float, recipe: str, scale_layout: str):
    return reference.rms_norm_mxfp8(x, weight, eps, recipe=recipe, scale_layout=scale_layout)


def _add_mx_reference(
    x: torch.Tensor, residual: torch.Tensor, weight: torch.Tensor, eps: float, recipe: str, scale_layout: str
):  # fmt: skip
    return reference.rms_norm_mxfp8(x, weight, eps, residual=residual, recipe=recipe, scale_layout=scale_layout)


def _fp4_reference(x: torch.Tensor, weight: torch.Tensor, global_scale: torch.Tensor, eps: float, scale_layout: str):
    return reference.rms_norm_nvfp4(x, weight, global_scale, eps, scale_layout=scale_layout)


def _add_fp4_reference(
    x: torch.Tensor, residual: torch.Tensor, weight: torch.Tensor, global_scale: torch.Tensor, eps: float, scale_layout: str
):  # fmt: skip
    return reference.rms_norm_nvfp4(x, weight, global_scale, eps, residual=residual, scale_layout=scale_layout)


def _launch_mx_alone(x, weight, q, scale, *params) -> None:
    _launch_mx(x, None, weight, q, scale, *params)


def _launch_fp4_alone(x, weight, global_scale, q, scale, *params) -> None:
    _launch_fp4(x, None, weight, global_scale, q, scale, *params)


_norm_mx = Op("rms_norm_mxfp8", ("q", "scale"), _mx_geometry, _launch_mx_alone, _mx_reference)
_add_norm_mx = Op("add_rms_norm_mxfp8", ("q", "scale"), _mx_geometry, _launch_mx, _add_mx_reference,
                  mutates=("residual",))  # fmt: skip
_norm_fp4 = Op("rms_norm_nvfp4", ("q", "scale"), _fp4_geometry, _launch_fp4_alone, _fp4_reference)
_add_norm_fp4 = Op("add_rms_norm_nvfp4", ("q", "scale"), _fp4_geometry, _launch_fp4, _add_fp4_reference,
                   mutates=("residual",))  # fmt: skip


# --- the public functions ------------------------------------------------------------------------


def _check(x, weight, eps, residual) -> None:
    """What the geometry and the reference need, and H at most 16384 (the kernels' limit) on either
    device; the C API judges the rest on the GPU (16-byte alignment, overlaps)."""
    check_norm_args(x, weight, eps, residual, max_h=NORM_MAX_H)
    if x.numel() and x.stride(1) != 1:
        raise ValueError(f"x must have a contiguous last dimension, got strides {tuple(x.stride())}")
    if residual is not None and residual.numel() and residual.stride(1) != 1:
        raise ValueError(f"residual must have a contiguous last dimension, got strides {tuple(residual.stride())}")
    if not weight.is_contiguous():
        raise ValueError("weight must be contiguous")


def rms_norm(
    x: torch.Tensor,
    weight: torch.Tensor,
    eps: float = 1e-6,
    *,
    residual: torch.Tensor | None = None,
    out: torch.Tensor | None = None,
) -> torch.Tensor | tuple[torch.Tensor, torch.Tensor]:
    """RMSNorm of the rows of ``x``, after adding ``residual`` (updated in place to ``x +
    residual``) when one is given: ``y = (h * r rounded to x's dtype) * weight`` with
    ``r = 1 / sqrt(mean(h * h) + eps)`` in float32 (docs/contract.md, "RMSNorm").

    Args:
        x: ``[M, H]`` bfloat16 or float16, last dimension contiguous; H a positive multiple of 16,
            at most 16384 (the kernels' limit, on the CPU too).
        weight: ``[H]`` of x's dtype, contiguous.
        eps: added to the mean square.
        residual: optional ``[M, H]`` of x's dtype, overwritten with ``x + residual`` (rounded
            to x's dtype), the value the norm reads.
        out: optional ``[M, H]`` of x's dtype to write y into; on the GPU its rows must be
            16-byte aligned (pointer and row stride a multiple of 8 elements).

    Returns:
        ``y``, or ``(y, residual)`` with a residual.

    Example::

        y, residual = fp8quant.rms_norm(x, weight, 1e-6, residual=residual)
    """
    _check(x, weight, eps, residual)
    outs = None if out is None else (out,)
    if residual is None:
        return _norm(x, weight, float(eps), out=outs)[0]
    return _add_norm(x, residual, weight, float(eps), out=outs)[0], residual


def rms_norm_quant(
    x: torch.Tensor,
    weight: torch.Tensor,
    eps: float = 1e-6,
    *,
    residual: torch.Tensor | None = None,
    group_size: int = 128,
    scale_layout: str = "row",
    ue8m0: bool | None = None,
    quant_eps: float = 1e-10,
    out: tuple[torch.Tensor, torch.Tensor] | None = None,
) -> tuple[torch.Tensor, ...]:
    """:func:`rms_norm` and :func:`fp8quant.per_token_group_quant` in one pass: the normalized
    rows are quantized in groups of ``group_size`` without being written, bit for bit the bytes
    of the two ops one after the other.

    Args:
        x, weight, eps, residual: as :func:`rms_norm`.
        group_size, scale_layout, ue8m0: as :func:`fp8quant.per_token_group_quant`.
        quant_eps: the quantizer's lower bound of each group's amax
            (:func:`fp8quant.per_token_group_quant`'s ``eps``).
        out: optional ``(q, scale)`` to write into, as :func:`fp8quant.per_token_group_quant`
            takes them; on the GPU q's rows must be 16-byte aligned (pointer and row stride a
            multiple of 16).

    Returns:
        ``(q, scale)``, or ``(q, scale, residual)`` with a residual.

    Example::

        q, s, residual = fp8quant.rms_norm_quant(x, weight, 1e-6, residual=residual, scale_layout="mn_tma")
    """
    _check(x, weight, eps, residual)
    ue8m0 = resolve_ue8m0(scale_layout, ue8m0)
    check_quant_args(x, group_size, quant_eps, "quant_eps")
    params = (float(eps), group_size, scale_layout, ue8m0, float(quant_eps))
    if residual is None:
        return _norm_quant(x, weight, *params, out=out)
    q, scale = _add_norm_quant(x, residual, weight, *params, out=out)
    return q, scale, residual


def rms_norm_mxfp8(
    x: torch.Tensor,
    weight: torch.Tensor,
    eps: float = 1e-6,
    *,
    residual: torch.Tensor | None = None,
    recipe: str = "rceil",
    scale_layout: str = "swizzled",
    out: tuple[torch.Tensor, torch.Tensor] | None = None,
) -> tuple[torch.Tensor, ...]:
    """:func:`rms_norm` and :func:`fp8quant.mxfp8_quant` in one pass: the normalized rows are
    quantized to MXFP8 (groups of 32, E8M0 scale bytes) without being written, bit for bit the
    bytes of the two ops one after the other.

    Args:
        x, weight, eps, residual: as :func:`rms_norm`; H a multiple of 32.
        recipe, scale_layout: as :func:`fp8quant.mxfp8_quant` (``"swizzled"`` by default: what
            Blackwell's block-scaled GEMMs read).
        out: optional ``(q, scale)`` of exactly the shapes and dtypes returned; on the GPU q's
            rows must be 16-byte aligned.

    Returns:
        ``(q, scale)``, or ``(q, scale, residual)`` with a residual.

    Example::

        q, scale, residual = fp8quant.rms_norm_mxfp8(x, weight, 1e-6, residual=residual)
    """
    _check_block_scaled(x, weight, eps, residual, MX_GROUP)
    check_mx_options(scale_layout, recipe)
    if residual is None:
        return _norm_mx(x, weight, float(eps), recipe, scale_layout, out=out)
    q, scale = _add_norm_mx(x, residual, weight, float(eps), recipe, scale_layout, out=out)
    return q, scale, residual


def rms_norm_nvfp4(
    x: torch.Tensor,
    weight: torch.Tensor,
    global_scale: torch.Tensor,
    eps: float = 1e-6,
    *,
    residual: torch.Tensor | None = None,
    scale_layout: str = "swizzled",
    out: tuple[torch.Tensor, torch.Tensor] | None = None,
) -> tuple[torch.Tensor, ...]:
    """:func:`rms_norm` and :func:`fp8quant.nvfp4_quant` in one pass: the normalized rows are
    quantized to NVFP4 (groups of 16, e2m1 two to a byte, e4m3 scale bytes) without being
    written, bit for bit the bytes of the two ops one after the other.

    Args:
        x, weight, eps, residual: as :func:`rms_norm`.
        global_scale: the float32 encode scale ``[]`` on x's device: a calibrated value (the
            kernel quantizes each row as it normalizes it, before the tensor's amax is known).
        scale_layout: as :func:`fp8quant.nvfp4_quant`.
        out: optional ``(q, scale)`` of exactly the shapes and dtypes returned; on the GPU q's
            rows must be 8-byte aligned.

    Returns:
        ``(q, scale)``, or ``(q, scale, residual)`` with a residual; dequantize with
        ``value * scale / global_scale``.

    Example::

        q, scale = fp8quant.rms_norm_nvfp4(x, weight, input_global_scale, 1e-6)
    """
    _check_block_scaled(x, weight, eps, residual, NVFP4_GROUP)
    check_mx_options(scale_layout)
    global_scale = check_global_scale(global_scale, x.device, ((),))
    if residual is None:
        return _norm_fp4(x, weight, global_scale, float(eps), scale_layout, out=out)
    q, scale = _add_norm_fp4(x, residual, weight, global_scale, float(eps), scale_layout, out=out)
    return q, scale, residual


def _check_block_scaled(x, weight, eps, residual, group: int) -> None:
    """What the block-scaled norms need: :func:`rms_norm`'s checks and H a multiple of the group."""
    _check(x, weight, eps, residual)
    if x.shape[1] % group:
        raise ValueError(f"x.shape[-1] (H={x.shape[1]}) must be a multiple of {group}")
