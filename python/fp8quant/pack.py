"""Scale transforms (SPEC.md sections 2 and 3), each declared once (``fp8quant._ops.Op``) with its
CUDA launch: fp32 scales between layouts, power-of-two scales packed four UE8M0 bytes to an int32
and back, and DeepGEMM SM100's weight-scale form.

CUDA tensors run the kernels; CPU tensors run :mod:`fp8quant.reference`. Every output is a whole
buffer of its layout with the padding rows and bytes written as 0.

A value that cannot be converted (a scale that is not a power of two, the UE8M0 NaN byte) raises
``ValueError`` naming its index and value, as the reference does. On the GPU that check reads one
flag back from the device, a synchronization; it is skipped where synchronizing is not allowed
(``torch.compile`` tracing, CUDA-graph capture) and with ``validate=False``. The kernels write
the UE8M0 NaN byte 0xFF (packing) or a float32 NaN (unpacking) in place of such a value, so it
cannot pass for a valid scale downstream.
"""

from __future__ import annotations

import torch

from . import reference
from ._checks import check_packed_tensor, check_scale_tensor, check_weight_scale_args
from ._ext import LAYOUT_CODES, extension, launch
from ._ops import Buffer, Op, TensorMeta, tracing
from .layouts import scale_buffer

__all__ = ["convert_scales", "pack_ue8m0", "sm100_weight_scales", "unpack_ue8m0"]

_FP32_LAYOUTS = ("row", "mn", "mn_tma")
_NO_INVALID = -1  # first_invalid's UINT64_MAX, read as int64


def _check_fp32_layout(layout: str, name: str) -> None:
    """``layout``, the argument ``name``, is an fp32 layout (a message naming it, whatever the value)."""
    if layout not in _FP32_LAYOUTS:
        raise ValueError(f"{name} must be one of {_FP32_LAYOUTS}, got {layout!r}")


def _scale_buffer(layout: str, shape: tuple, num_groups: int) -> Buffer:
    """The whole buffer of ``layout`` for scales ``[*, M, num_groups]``, as the quantizer allocates it."""
    return scale_buffer(layout, shape[-2], num_groups, tuple(shape[:-2]), f"for layout {layout!r}")


_FLAG = Buffer(torch.int64, (1,))  # first_invalid: the flat index of the first bad value, or -1


def _batch_rows(shape: tuple) -> tuple[int, int]:
    batch = 1
    for n in shape[:-2]:
        batch *= n
    return batch, shape[-2]


def _run_transform(op: str, src: torch.Tensor, src_layout: str, dst: torch.Tensor, dst_layout: str,
                   num_groups: int, block_n: int, flag: torch.Tensor | None) -> None:  # fmt: skip
    """Enqueue one scale transform on src's device and current stream (the C API checks every value)."""
    batch, rows = _batch_rows(dst.shape)
    if flag is not None:
        flag.fill_(_NO_INVALID)
    launch(
        extension().scale_transform_ptr, src.get_device(), op, src.data_ptr(), LAYOUT_CODES[src_layout],
        dst.data_ptr(), LAYOUT_CODES[dst_layout], batch, rows, num_groups, block_n,
        0 if flag is None else flag.data_ptr(),
    )  # fmt: skip


def _raise_if_invalid(flag: torch.Tensor, shape: tuple, describe) -> None:
    """Raise what the reference raises for the first value a kernel could not convert (one
    device read; skipped while tracing or capturing a CUDA graph, where it cannot sync)."""
    if flag.is_cuda and (tracing() or torch.cuda.is_current_stream_capturing()):
        return
    index = int(flag.item())
    if index == _NO_INVALID:
        return
    position = []
    for n in reversed(shape):
        position.insert(0, index % n)
        index //= n
    raise ValueError(describe(tuple(position)))


# --- convert_scales ------------------------------------------------------------------------------


def _convert_geometry(scale: TensorMeta, from_layout: str, to_layout: str) -> tuple[Buffer]:
    return (_scale_buffer(to_layout, scale.shape, scale.shape[-1]),)


def _convert_launch(scale, out, from_layout: str, to_layout: str) -> None:
    _run_transform("convert", scale, from_layout, out, to_layout, scale.shape[-1], 1, None)


def _convert_reference(scale: torch.Tensor, from_layout: str, to_layout: str):
    return (reference.convert_scales(scale, from_layout, to_layout),)


_convert = Op("convert_scales", ("out",), _convert_geometry, _convert_launch, _convert_reference)


def convert_scales(scale: torch.Tensor, from_layout: str, to_layout: str) -> torch.Tensor:
    """fp32 scales ``[*, M, G]`` in ``from_layout`` as ``to_layout``.

    Args:
        scale: float32 with the exact shape and strides of ``from_layout`` (as
            :func:`fp8quant.per_token_group_quant` returns them).
        from_layout, to_layout: ``"row"``, ``"mn"`` or ``"mn_tma"``.

    Returns:
        The same values in a new whole buffer of ``to_layout`` (padding rows 0).

    Example::

        q, s = fp8quant.per_token_group_quant(x, scale_layout="row")
        s_tma = fp8quant.convert_scales(s, "row", "mn_tma")   # for DeepGEMM SM90
    """
    _check_fp32_layout(from_layout, "from_layout")
    _check_fp32_layout(to_layout, "to_layout")
    check_scale_tensor(scale, from_layout, torch.float32)
    (out,) = _convert(scale, from_layout, to_layout)
    return out


# --- pack_ue8m0 / unpack_ue8m0 -------------------------------------------------------------------


def _pack_geometry(scale: TensorMeta, from_layout: str) -> tuple[Buffer, Buffer]:
    return _scale_buffer("packed_ue8m0", scale.shape, scale.shape[-1]), _FLAG


def _pack_launch(scale, packed, flag, from_layout: str) -> None:
    _run_transform("pack", scale, from_layout, packed, "packed_ue8m0", scale.shape[-1], 1, flag)


def _pack_reference(scale: torch.Tensor, from_layout: str):
    return reference.pack_ue8m0(scale, from_layout), torch.full((1,), _NO_INVALID, dtype=torch.int64)


_pack = Op("pack_ue8m0", ("packed", "first_invalid"), _pack_geometry, _pack_launch, _pack_reference)


def _not_packable(scale: torch.Tensor, name: str):
    return lambda at: (
        f"{name}{list(at)} = {scale[at].item()!r} is not a power of two in [2^-127, 2^127]: "
        "only UE8M0 values can be packed (quantize with ue8m0=True, or requantize_ue8m0 a weight)"
    )


def pack_ue8m0(scale: torch.Tensor, from_layout: str = "mn_tma", *, validate: bool = True) -> torch.Tensor:
    """Power-of-two fp32 scales ``[*, M, G]`` as packed_ue8m0 (DeepGEMM SM100's activation scales).

    Args:
        scale: float32 in ``from_layout`` (``"row"``, ``"mn"`` or ``"mn_tma"``), each value ``2^k``
            for an integer k in [-127, 127]: what the quantizers write with ``ue8m0=True``.
        validate: raise ``ValueError`` naming the first scale that is not such a power of two
            (on the GPU: one synchronization; see the module docstring).

    Returns:
        int32 ``[*, M, ceil(G/4)]`` with strides ``(1, align(M, 4))``: byte ``j`` of word ``p`` is
        the UE8M0 byte of group ``4p + j``; padding bytes and rows are 0.
    """
    _check_fp32_layout(from_layout, "from_layout")
    check_scale_tensor(scale, from_layout, torch.float32)
    packed, flag = _pack(scale, from_layout)
    if validate:
        _raise_if_invalid(flag, tuple(scale.shape), _not_packable(scale, "scale"))
    return packed


def _unpack_geometry(packed: TensorMeta, num_groups: int, to_layout: str) -> tuple[Buffer, Buffer]:
    return _scale_buffer(to_layout, packed.shape, num_groups), _FLAG


def _unpack_launch(packed, scale, flag, num_groups: int, to_layout: str) -> None:
    _run_transform("unpack", packed, "packed_ue8m0", scale, to_layout, num_groups, 1, flag)


def _unpack_reference(packed: torch.Tensor, num_groups: int, to_layout: str):
    return reference.unpack_ue8m0(packed, num_groups, to_layout), torch.full((1,), _NO_INVALID, dtype=torch.int64)


_unpack = Op("unpack_ue8m0", ("scale", "first_invalid"), _unpack_geometry, _unpack_launch, _unpack_reference)


def unpack_ue8m0(
    packed: torch.Tensor, num_groups: int, to_layout: str = "mn_tma", *, validate: bool = True
) -> torch.Tensor:
    """The fp32 scales ``2^(e - 127)`` of packed_ue8m0 words ``[*, M, ceil(G/4)]``, ``G = num_groups``,
    in ``to_layout`` (byte 0 is 2^-127, a float32 subnormal). With ``validate``, the UE8M0 NaN
    byte 0xFF raises ``ValueError`` naming the group."""
    _check_fp32_layout(to_layout, "to_layout")
    check_packed_tensor(packed, num_groups)
    scale, flag = _unpack(packed, num_groups, to_layout)
    if validate:
        _raise_if_invalid(
            flag,
            (*packed.shape[:-1], num_groups),
            lambda at: f"packed holds the UE8M0 NaN byte 0xFF for group {list(at)}",
        )
    return scale


# --- sm100_weight_scales -------------------------------------------------------------------------


def _sm100_geometry(w_scale: TensorMeta, n: int, block_n: int) -> tuple[Buffer, Buffer]:
    return _scale_buffer("packed_ue8m0", (*w_scale.shape[:-2], n, w_scale.shape[-1]), w_scale.shape[-1]), _FLAG


def _sm100_launch(w_scale, packed, flag, n: int, block_n: int) -> None:
    _run_transform("sm100_weight_scales", w_scale, "row", packed, "packed_ue8m0", w_scale.shape[-1], block_n, flag)


def _sm100_reference(w_scale: torch.Tensor, n: int, block_n: int):
    return reference.sm100_weight_scales(w_scale, n, block_n), torch.full((1,), _NO_INVALID, dtype=torch.int64)


_sm100 = Op("sm100_weight_scales", ("packed", "first_invalid"), _sm100_geometry, _sm100_launch, _sm100_reference)


def sm100_weight_scales(w_scale: torch.Tensor, n: int, block_n: int = 128, *, validate: bool = True) -> torch.Tensor:
    """DeepGEMM SM100's form of power-of-two per-block weight scales (SPEC.md section 3).

    Args:
        w_scale: contiguous float32 ``[*, ceil(N/block_n), ceil(K/128)]`` powers of two, as
            ``per_block_quant(w, ue8m0=True)`` or :func:`fp8quant.requantize_ue8m0` return them.
        n: N, the weight's rows.
        validate: raise ``ValueError`` naming the first scale that is not a power of two (by its
            index in ``w_scale``).

    Returns:
        int32 ``[*, N, ceil(kb/4)]``, strides ``(1, align(N, 4))``: row ``n`` holds the packed
        UE8M0 bytes of block row ``n // block_n``.
    """
    check_weight_scale_args(w_scale, n, block_n)
    packed, flag = _sm100(w_scale, n, block_n)
    if validate:
        _raise_if_invalid(flag, tuple(w_scale.shape), _not_packable(w_scale, "w_scale"))
    return packed
