"""Scale layouts: shapes, strides and allocation sizes (SPEC.md section 2).

Every function here is pure arithmetic on sizes, shared by the CUDA path, the
reference and the fake (meta) implementations, so that all three agree on the
exact strides a GEMM will see.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from ._ops import Buffer

__all__ = [
    "scale_buffer",
    "SCALE_FORMATS",
    "SCALE_LAYOUTS",
    "ScaleSpec",
    "align",
    "check_scale_layout",
    "empty_scale",
    "scale_spec",
]

#: Every scale layout fp8quant writes, by the name the Python API takes.
SCALE_LAYOUTS = ("row", "mn", "mn_tma", "packed_ue8m0")

#: Every ``(scale_layout, ue8m0)`` pair the op writes: the fp32 layouts with plain or
#: power-of-two scales, and packed UE8M0.
SCALE_FORMATS = (
    ("row", False),
    ("row", True),
    ("mn", False),
    ("mn", True),
    ("mn_tma", False),
    ("mn_tma", True),
    ("packed_ue8m0", True),
)

# Rows of TMA-aligned layouts are padded to a multiple of this (16 bytes of 4-byte scales).
_TMA_ROW_ALIGN = 4
# UE8M0 bytes packed into one int32 word.
_PACK = 4


def align(n: int, a: int) -> int:
    """``n`` rounded up to a multiple of ``a``."""
    return (n + a - 1) // a * a


def check_scale_layout(scale_layout: str) -> str:
    if scale_layout not in SCALE_LAYOUTS:
        raise ValueError(f"scale_layout must be one of {', '.join(map(repr, SCALE_LAYOUTS))}; got {scale_layout!r}")
    return scale_layout


@dataclass(frozen=True)
class ScaleSpec:
    """Where the scales of ``[*batch, m, k]`` input live.

    ``shape``/``stride`` describe the tensor handed to the GEMM (elements); ``numel`` is the
    size of the buffer behind it, padding included; ``rows`` is the padded row count (``m`` or
    ``align(m, 4)``) and ``cols`` the number of scale columns (groups, or int32 words).
    """

    layout: str
    dtype: torch.dtype
    shape: tuple[int, ...]
    stride: tuple[int, ...]
    numel: int
    rows: int
    cols: int


def scale_spec(scale_layout: str, m: int, num_groups: int, batch: tuple[int, ...] = ()) -> ScaleSpec:
    """The scale tensor's geometry for ``m`` rows of ``num_groups`` groups each.

    ``batch`` holds the leading dimensions of the input (``()`` for 2-D input, ``(B,)`` for
    ``[B, M, K]``); each batch owns one contiguous ``rows * cols`` block. Sizes are ints >= 0
    (the C API's ``fp8quant_scale_shape`` rule)::

        spec = scale_spec("mn_tma", 5, 3)      # shape (5, 3), stride (1, 8), numel 24
    """
    from ._checks import check_int  # noqa: PLC0415 - _checks imports this module

    check_scale_layout(scale_layout)
    if not isinstance(batch, (tuple, list)):
        raise TypeError(f"batch must be a tuple of ints (the leading dimensions), got {type(batch).__name__}")
    for name, size in (("m", m), ("num_groups", num_groups), *((f"batch[{i}]", b) for i, b in enumerate(batch))):
        if not isinstance(size, torch.SymInt):  # a traced tensor's size: never negative
            check_int(size, name, 0)
    if scale_layout == "row":
        rows, cols, inner = m, num_groups, (num_groups, 1)
    elif scale_layout == "mn":
        rows, cols, inner = m, num_groups, (1, m)
    elif scale_layout == "mn_tma":
        rows = align(m, _TMA_ROW_ALIGN)
        cols, inner = num_groups, (1, rows)
    else:  # packed_ue8m0
        rows = align(m, _TMA_ROW_ALIGN)
        cols = (num_groups + _PACK - 1) // _PACK
        inner = (1, rows)
    block = rows * cols
    outer: list[int] = []
    step = block
    for size in reversed(batch):
        outer.insert(0, step)
        step *= size
    dtype = torch.int32 if scale_layout == "packed_ue8m0" else torch.float32
    return ScaleSpec(
        layout=scale_layout,
        dtype=dtype,
        shape=(*batch, m, cols),
        stride=(*outer, *inner),
        numel=step,
        rows=rows,
        cols=cols,
    )


def empty_scale(
    scale_layout: str,
    m: int,
    num_groups: int,
    batch: tuple[int, ...] = (),
    device: torch.device | str | None = None,
) -> torch.Tensor:
    """An uninitialised scale tensor with the layout's strides over a buffer that holds its
    padding too (``torch.empty_strided`` alone would leave the last column's padding rows
    outside the allocation)."""
    spec = scale_spec(scale_layout, m, num_groups, batch)
    buf = torch.empty(spec.numel, dtype=spec.dtype, device=device)
    return buf.as_strided(spec.shape, spec.stride)


def scale_buffer(scale_layout: str, m: int, num_groups: int, batch: tuple[int, ...] = (), context: str = "") -> Buffer:
    """The output geometry (``fp8quant._ops.Buffer``) of scales in ``scale_layout``: the
    ``[*batch, m, ...]`` view over the layout's whole buffer, padding rows included; ``context``
    ends the messages about a wrong ``out=`` tensor (default ``"for scale_layout='mn'"``)."""
    spec = scale_spec(scale_layout, m, num_groups, batch)
    full_shape = (*spec.shape[:-2], spec.rows, spec.cols)  # the padding rows too
    context = context or f"for scale_layout={scale_layout!r}"
    return Buffer(spec.dtype, spec.shape, spec.stride, spec.numel, context, full_shape)
