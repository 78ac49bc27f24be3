"""per_token_group_quant: the public op, declared once (``fp8quant._ops.Op``), and its CUDA launch."""

from __future__ import annotations

import torch

from . import reference
from ._checks import FP8_DTYPE, check_quant_args, resolve_ue8m0
from ._ext import LAYOUT_CODES, launch_rows
from ._ext import extension as _extension
from ._ops import Buffer, Op, TensorMeta
from .layouts import scale_buffer

__all__ = ["per_token_group_quant"]


def _geometry(x: TensorMeta, group_size: int, scale_layout: str, ue8m0: bool, eps: float) -> tuple[Buffer, Buffer]:
    """q like x (row-major, any row and batch strides with ``out=``); the scale layout's buffer."""
    scale = scale_buffer(scale_layout, x.shape[-2], x.shape[-1] // group_size, tuple(x.shape[:-2]))
    return Buffer(FP8_DTYPE, x.shape), scale


def _launch(
    x: torch.Tensor, q: torch.Tensor, scale: torch.Tensor, group_size: int, scale_layout: str, ue8m0: bool, eps: float
) -> None:
    """Enqueue the kernel on x's device and current stream: pointers and strides go straight to the
    C API, which checks every value (strides, alignment, overlap, limits)."""
    launch_rows(
        _extension().per_token_group_quant_ptr, x, q, scale.data_ptr(), LAYOUT_CODES[scale_layout], ue8m0,
        group_size, eps,
    )  # fmt: skip


def _reference(x: torch.Tensor, group_size: int, scale_layout: str, ue8m0: bool, eps: float):
    return reference.per_token_group_quant(x, group_size, scale_layout=scale_layout, ue8m0=ue8m0, eps=eps)


_quant = Op("per_token_group_quant", ("q", "scale"), _geometry, _launch, _reference)


def per_token_group_quant(
    x: torch.Tensor,
    group_size: int = 128,
    *,
    scale_layout: str = "row",
    ue8m0: bool | None = None,
    eps: float = 1e-10,
    out: tuple[torch.Tensor, torch.Tensor] | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Quantize ``x`` to float8_e4m3fn in groups of ``group_size`` along the last dimension.

    Args:
        x: ``[M, K]`` or ``[B, M, K]`` bfloat16, float16 or float32, last dimension contiguous.
            CUDA tensors run the fused kernel (compute capability 9.0 or 10.x); CPU tensors run
            the reference.
        group_size: 32, 64 or 128; must divide K.
        scale_layout: ``"row"`` (fp32 ``[M, G]`` K-major), ``"mn"`` (fp32 column-major),
            ``"mn_tma"`` (fp32 column-major, rows padded to 4: DeepGEMM SM90 and
            ``torch._scaled_mm``) or ``"packed_ue8m0"`` (int32 ``[M, ceil(G/4)]``, four UE8M0
            bytes a word: DeepGEMM SM100).
        ue8m0: round scales up to powers of two. Defaults to True for ``"packed_ue8m0"`` (which
            requires it) and False otherwise.
        eps: lower bound of each group's amax, at least the smallest normal float32
            (DeepGEMM and DeepEP use 1e-4).
        out: optional ``(q, scale)`` to write into: q with x's shape (rows may be strided), the
            scale as the op would allocate it (see :func:`fp8quant.empty_scale`).

    Returns:
        ``(q, scale)``: q float8_e4m3fn with x's shape; scale in ``scale_layout``.

    Example::

        q, s = fp8quant.per_token_group_quant(x, 128, scale_layout="mn_tma")
        # ceil(K / 128) a multiple of 4 (docs/backends.md: cuBLASLt misreads w_s otherwise);
        # fp8quant.linear prepares the weight for any K
        y = torch._scaled_mm(q, w_q.t(), s, w_s.t(), out_dtype=torch.bfloat16)
    """
    ue8m0 = resolve_ue8m0(scale_layout, ue8m0)
    check_quant_args(x, group_size, eps)
    return _quant(x, group_size, scale_layout, ue8m0, float(eps), out=out)
