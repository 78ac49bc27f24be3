"""Mixture-of-experts ops around the grouped GEMMs (docs/contract.md, "MoE"), declared once each
(``fp8quant._ops.Op``) with their CUDA launch: the routing metadata, SiLU-and-mul + quantize,
dispatch + quantize, and the combine step."""

from __future__ import annotations

from typing import NamedTuple

import torch

from . import reference
from ._checks import (
    FP8_DTYPE,
    INPUT_DTYPES,
    check_eps,
    check_int,
    check_masked_max_m,
    check_moe_group_size,
    check_routing_tokens,
    resolve_ue8m0,
)
from ._ext import DTYPE_CODES, LAYOUT_CODES, extension, launch
from ._ops import Buffer, Op, TensorMeta, tracing
from .layouts import scale_buffer
from .mx import MX_LAYOUT_CODES, MX_RECIPE_CODES, block_scaled_outputs, check_global_scale, check_mx_options
from .routing import MoeRouting

__all__ = [
    "MoeBounds",
    "moe_bounds",
    "moe_combine",
    "moe_dispatch_nvfp4",
    "moe_dispatch_quant",
    "moe_routing",
    "silu_mul_mxfp8",
    "silu_mul_nvfp4",
    "silu_mul_quant",
]


_ROWS_OVERFLOW, _MAX_M_OVERFLOW = 1, 2  # fp8quant_routing_status_t bits


# --- moe_routing ---------------------------------------------------------------------------------


def _routing_geometry(
    topk_ids: TensorMeta, num_experts: int, expert_offset: int, align: int, rows: int, max_m: int
) -> tuple[Buffer, ...]:
    t, k = topk_ids.shape
    i32 = torch.int32
    return (
        Buffer(i32, (num_experts,)), Buffer(i32, (num_experts + 1,)), Buffer(i32, (rows,)), Buffer(i32, (rows,)),
        Buffer(i32, (t, k)), Buffer(i32, (t, k) if max_m else (0, k)), Buffer(i32, (1,)),
    )  # fmt: skip


def _routing_launch(topk_ids, counts, row_offsets, m_indices, row_token, inv_perm, masked_row, status,
                    num_experts: int, expert_offset: int, align: int, rows: int, max_m: int) -> None:  # fmt: skip
    t, k = topk_ids.shape
    launch(
        extension().moe_routing_ptr, topk_ids.get_device(), topk_ids.data_ptr(), 8 * topk_ids.element_size(), t, k,
        num_experts, expert_offset, align, rows, max_m, counts.data_ptr(), row_offsets.data_ptr(),
        m_indices.data_ptr(), row_token.data_ptr(), inv_perm.data_ptr(), masked_row.data_ptr() if max_m else 0,
        status.data_ptr(),
    )  # fmt: skip


def _routing_reference(topk_ids: torch.Tensor, num_experts: int, expert_offset: int, align: int, rows: int, max_m: int):
    r = reference.moe_routing(
        topk_ids, num_experts, expert_offset=expert_offset, align=align, max_m_sum=rows, max_m=max_m or None
    )
    masked_row = r.masked_row if max_m else r.inv_perm.new_empty((0, r.inv_perm.shape[1]))
    return (*r[:5], masked_row, torch.zeros(1, dtype=torch.int32, device=topk_ids.device))


_routing = Op(
    "moe_routing",
    ("counts", "row_offsets", "m_indices", "row_token", "inv_perm", "masked_row", "status"),
    _routing_geometry,
    _routing_launch,
    _routing_reference,
)


def _m_sum(topk_ids: torch.Tensor, num_experts: int, expert_offset: int, align: int) -> int:
    """M_sum of a routing, read back from the device (the one synchronization of moe_routing
    without max_m_sum)."""
    ids = topk_ids.reshape(-1).long() - expert_offset
    valid = (topk_ids.reshape(-1) >= 0) & (ids >= 0) & (ids < num_experts)
    counts = torch.bincount(torch.where(valid, ids, num_experts), minlength=num_experts + 1)[:num_experts]
    return int(((counts + align - 1) // align * align).sum())


class MoeBounds(NamedTuple):
    """Static bounds of the MoE layouts for a batch of ``tokens`` (:func:`moe_bounds`)."""

    max_m_sum: int  # rows of the contiguous layout
    max_m: int  # rows per expert of the masked layout


def moe_bounds(tokens: int, top_k: int, num_experts: int, *, align: int = 128) -> MoeBounds:
    """The bounds engines size MoE buffers by, so that routing needs no device-to-host read and
    a CUDA graph captured for ``tokens`` serves every routing of them:

    - ``max_m_sum = T*k + min(T*k, E) * (align - 1)``, rounded up to ``align``: every slot a row,
      and at most ``min(T*k, E)`` experts each padded by fewer than ``align`` rows;
    - ``max_m = max(T, 1)``: top-k ids of one token are distinct, so no expert gets more than T slots
      (ids that repeat within a token can exceed it; :meth:`MoeRouting.check` then says so).

    Example::

        bounds = fp8quant.moe_bounds(x.shape[0], topk_ids.shape[1], 256)
        routing = fp8quant.moe_routing(topk_ids, 256, max_m_sum=bounds.max_m_sum, max_m=bounds.max_m)
    """
    for name, value, minimum in (("tokens", tokens, 0), ("top_k", top_k, 1), ("num_experts", num_experts, 1),
                                 ("align", align, 1)):  # fmt: skip
        check_int(value, name, minimum)
    slots = tokens * top_k
    rows = slots + min(slots, num_experts) * (align - 1)
    return MoeBounds(-(-rows // align) * align, max(tokens, 1))


def moe_routing(
    topk_ids: torch.Tensor,
    num_experts: int,
    *,
    expert_offset: int = 0,
    align: int = 128,
    max_m_sum: int | None = None,
    max_m: int | None = None,
    validate: bool | None = None,
) -> MoeRouting:
    """Routing metadata of ``topk_ids [T, k]`` for the local experts ``expert_offset ..
    expert_offset + num_experts - 1``: the contiguous layout (each expert's rows ``align``-aligned;
    ``m_indices``, ``row_token``, ``inv_perm``, ``row_offsets``) and, with ``max_m``, the masked
    layout (``masked_row``); see :class:`fp8quant.MoeRouting` and docs/contract.md.

    Args:
        topk_ids: int32 or int64 ``[T, k]``, contiguous; -1 (or any id outside the local range)
            drops a slot.
        max_m_sum: the number of contiguous rows, an upper bound on M_sum (:func:`moe_bounds`):
            with it the GPU path reads nothing back from the device (safe in CUDA graphs).
            Without it M_sum is computed first (one synchronization).
        max_m: rows per expert of the masked layout ``[E, max_m, H]``.
        validate: whether to raise ValueError here when a bound is too small (the reference's
            message). ``None`` (default): only without ``max_m_sum``, where the call synchronizes
            anyway (to compute M_sum; the check adds one more read); otherwise the kernel's
            status stays on the device in
            ``routing.status`` and :meth:`~fp8quant.MoeRouting.check` reads it when
            the caller chooses. ``True``: read it now (skipped while tracing or capturing);
            ``False``: never. The kernels never write past the bounds: slots that do not fit
            get row -1.
    """
    if (
        not isinstance(topk_ids, torch.Tensor)
        or topk_ids.dtype not in (torch.int32, torch.int64)
        or topk_ids.dim() != 2
    ):
        raise TypeError("topk_ids must be an int32 or int64 tensor [T, k]")
    if not topk_ids.is_cuda:
        return reference.moe_routing(
            topk_ids, num_experts, expert_offset=expert_offset, align=align, max_m_sum=max_m_sum, max_m=max_m
        )
    if not topk_ids.is_contiguous():
        raise ValueError(f"topk_ids must be contiguous, got strides {tuple(topk_ids.stride())}")
    for name, value, minimum in (
        ("num_experts", num_experts, 1),
        ("expert_offset", expert_offset, 0),
        ("align", align, 1),
    ):
        check_int(value, name, minimum)
    for name, value, minimum in (("max_m_sum", max_m_sum, 0), ("max_m", max_m, 1)):
        check_int(value, name, minimum, allow_none=True)
    rows = _m_sum(topk_ids, num_experts, expert_offset, align) if max_m_sum is None else max_m_sum
    counts, row_offsets, m_indices, row_token, inv_perm, masked_row, status = _routing(
        topk_ids, num_experts, expert_offset, align, rows, max_m or 0
    )
    routing = MoeRouting(
        counts, row_offsets, m_indices, row_token, inv_perm, masked_row if max_m else None, status, max_m
    )
    if validate is None:
        validate = max_m_sum is None
    if validate and not (tracing() or torch.cuda.is_current_stream_capturing()):
        bits = int(status.item())
        if bits & _ROWS_OVERFLOW:
            raise ValueError(
                f"max_m_sum={max_m_sum} is smaller than M_sum={int(row_offsets[-1])} (rows, {align}-aligned per expert)"
            )
        if bits & _MAX_M_OVERFLOW:
            raise ValueError(f"max_m={max_m} is smaller than the {int(counts.max())} slots of the busiest expert")
    return routing


# --- moe_combine ---------------------------------------------------------------------------------


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


def _combine_reference(y: torch.Tensor, rows: torch.Tensor, weights: torch.Tensor):
    return (reference.moe_combine(y, rows, weights),)


_combine = Op("moe_combine", ("out",), _combine_geometry, _combine_launch, _combine_reference)


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
        raise ValueError(
            f"y [E, max_m, H] must have evenly spaced rows (stride(0) == max_m * stride(1)), got strides {tuple(y.stride())}"
        )
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


def _check_dispatch(x, routing, layout: str, max_m, align: int, group: int, group_name: str = "the group size") -> None:
    """What the dispatch ops need of x [T, H] (H a positive multiple of ``group``), the routing
    (its index tensors on x's device) and the layout's bounds."""
    if layout not in ("contiguous", "masked"):
        raise ValueError(f"layout must be 'contiguous' or 'masked', got {layout!r}")
    if not isinstance(x, torch.Tensor) or x.dtype not in INPUT_DTYPES or x.dim() != 2:
        raise TypeError("x must be a bfloat16, float16 or float32 tensor [T, H]")
    if x.shape[1] == 0 or x.shape[1] % group:
        raise ValueError(f"x.shape[-1] (H={x.shape[1]}) must be a positive multiple of {group_name} ({group})")
    if x.numel() > 0 and x.stride(-1) != 1:
        raise ValueError(f"x must have a contiguous last dimension, got strides {tuple(x.stride())}")
    if not isinstance(routing, MoeRouting):
        raise TypeError("routing must be fp8quant.moe_routing's result (a MoeRouting)")
    if layout == "masked" and (isinstance(max_m, bool) or not isinstance(max_m, int) or max_m < 1):
        raise ValueError(f"layout='masked' needs max_m, an int >= 1, got {max_m!r}")
    if layout == "masked" and routing.masked_row is None:
        raise ValueError("layout='masked' needs a routing made with max_m (routing.masked_row is None)")
    if layout == "masked":
        check_masked_max_m(routing, max_m)
    check_int(align, "align")
    check_routing_tokens(x, routing)
    slot_rows = routing.masked_row if layout == "masked" else routing.inv_perm
    for name, t in (("inv_perm" if layout == "contiguous" else "masked_row", slot_rows), ("row_offsets", routing.row_offsets),
                    ("counts", routing.counts)):  # fmt: skip
        if t.dtype != torch.int32 or not t.is_contiguous() or t.device != x.device:
            raise ValueError(f"routing.{name} must be a contiguous int32 tensor on {x.device}")


# --- moe_dispatch_nvfp4 --------------------------------------------------------------------------


def _dispatch_fp4_geometry(x: TensorMeta, slot_rows: TensorMeta, counts: TensorMeta, *rest) -> tuple[Buffer, Buffer]:
    """q [rows, H / 2] (contiguous, max_m == 0) or [E, max_m, H / 2] (masked); the scale bytes."""
    rows, max_m, scale_layout = rest[-4], rest[-3], rest[-1]
    h = x.shape[-1]
    return block_scaled_outputs((rows, h) if max_m == 0 else (counts.shape[0], max_m, h), "nvfp4", scale_layout)


def _dispatch_fp4_launch(
    x, slot_rows, counts, row_offsets, m_indices, global_scale, q, scale, rows, max_m, align, scale_layout
) -> None:
    qs = q.stride()
    masked = max_m > 0
    launch(
        extension().moe_dispatch_nvfp4_ptr, x.get_device(), x.data_ptr(), DTYPE_CODES[x.dtype], x.shape[0],
        x.shape[1], x.stride(0), slot_rows.data_ptr(), slot_rows.shape[1], counts.data_ptr(),
        0 if masked else row_offsets.data_ptr(), 0 if masked else m_indices.data_ptr(), counts.shape[0], align, rows,
        max_m, q.data_ptr(), qs[0] if masked else 0, qs[-2], scale.data_ptr(), MX_LAYOUT_CODES[scale_layout],
        global_scale.data_ptr(), global_scale.numel(),
    )  # fmt: skip


def _dispatch_fp4_reference(
    x: torch.Tensor, slot_rows: torch.Tensor, counts: torch.Tensor, row_offsets: torch.Tensor,
    m_indices: torch.Tensor, global_scale: torch.Tensor, rows: int, max_m: int, align: int, scale_layout: str,
):  # fmt: skip
    """The reference writes zeros wherever the kernel leaves a byte unwritten (a valid filling)."""
    shape = (rows,) if max_m == 0 else (counts.shape[0], max_m)
    return reference.moe_scatter_nvfp4(x, slot_rows, shape, global_scale, row_experts=m_indices if max_m == 0 else None,
                                       scale_layout=scale_layout)  # fmt: skip


_dispatch_fp4 = Op("moe_dispatch_nvfp4", ("q", "scale"), _dispatch_fp4_geometry, _dispatch_fp4_launch,
                   _dispatch_fp4_reference)  # fmt: skip


def moe_dispatch_nvfp4(
    x: torch.Tensor,
    routing: MoeRouting,
    global_scale: torch.Tensor,
    *,
    layout: str = "contiguous",
    max_m: int | None = None,
    align: int = 128,
    scale_layout: str = "swizzled",
    out: tuple[torch.Tensor, torch.Tensor] | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Tokens ``x [T, H]`` stored in an expert-grouped layout in NVFP4, in one pass: each token
    read once and its groups' amax reduced once, then encoded with the encode scale of each of
    its slots' experts (NVFP4's encode scale differs by expert, so the bytes do too). The bytes
    of :func:`fp8quant.reference.moe_dispatch_nvfp4` on every row that holds a token
    (docs/contract.md, "NVFP4").

    Args:
        x: bfloat16, float16 or float32 ``[T, H]``, last dimension contiguous, H a positive
            multiple of 16: the T tokens the routing was made for.
        routing: :func:`fp8quant.moe_routing`'s result for these tokens.
        global_scale: float32 encode scales on x's device: ``[]`` for every expert, or ``[E]``,
            one per local expert (calibrated: engines keep one input scale per expert).
        layout, max_m, align: as :func:`moe_dispatch_quant` (q ``[rows, H / 2]`` or
            ``[E, max_m, H / 2]``, two e2m1 codes a byte).
        scale_layout: ``"swizzled"`` (what Blackwell's grouped GEMMs read) or ``"row"``.
        out: optional ``(q, scale)`` of exactly the shapes and dtypes returned.

    Rows without a token as :func:`moe_dispatch_quant`: q not written, scale bytes 0 inside
    their expert's tile, untouched past it (the CPU path writes zeros there).

    Example::

        q, scale = fp8quant.moe_dispatch_nvfp4(x, routing, a1_global_scales)
    """
    _check_dispatch(x, routing, layout, max_m, align, 16)
    check_mx_options(scale_layout)
    e = routing.counts.numel()
    global_scale = check_global_scale(global_scale, x.device, ((), (e,)))
    m_indices = routing.m_indices
    if m_indices.dtype != torch.int32 or not m_indices.is_contiguous() or m_indices.device != x.device:
        raise ValueError(f"routing.m_indices must be a contiguous int32 tensor on {x.device}")
    slot_rows = routing.masked_row if layout == "masked" else routing.inv_perm
    return _dispatch_fp4(
        x, slot_rows, routing.counts, routing.row_offsets, routing.m_indices, global_scale, routing.m_indices.numel(),
        max_m if layout == "masked" else 0, align, scale_layout, out=out,
    )  # fmt: skip


# --- silu_mul_quant ------------------------------------------------------------------------------


def _silu_geometry(
    x: TensorMeta,
    m_indices: TensorMeta,
    used_rows: TensorMeta,
    masked_m: TensorMeta,
    align: int,
    group_size: int,
    scale_layout: str,
    ue8m0: bool,
    eps: float,
) -> tuple[Buffer, Buffer]:
    """q [*, M, N] row-major; the scale layout's buffer for N / group_size groups."""
    n = x.shape[-1] // 2
    shape = (*x.shape[:-1], n)
    return Buffer(FP8_DTYPE, shape), scale_buffer(scale_layout, shape[-2], n // group_size, tuple(shape[:-2]))


def _silu_launch(x, m_indices, used_rows, masked_m, q, scale, align, group_size, scale_layout, ue8m0, eps) -> None:
    """x's rows as [gate | up]: launch_rows sees x's geometry, with n = K / 2 passed apart."""
    shape, xs, qs = x.shape, x.stride(), q.stride()
    batch, x_batch, q_batch = (1, 0, 0) if len(shape) == 2 else (shape[0], xs[0], qs[0])
    ptr = lambda t: t.data_ptr() if t.numel() else 0
    launch(
        extension().silu_mul_quant_ptr, x.get_device(), x.data_ptr(), DTYPE_CODES[x.dtype], batch, shape[-2],
        shape[-1] // 2, x_batch, xs[-2], q.data_ptr(), q_batch, qs[-2], ptr(m_indices), ptr(used_rows),
        ptr(masked_m), align, scale.data_ptr(), LAYOUT_CODES[scale_layout], ue8m0, group_size, eps,
    )  # fmt: skip


def _silu_reference(
    x: torch.Tensor, m_indices: torch.Tensor, used_rows: torch.Tensor, masked_m: torch.Tensor, align: int, group_size: int, scale_layout: str,
    ue8m0: bool, eps: float,
):  # fmt: skip
    return reference.silu_mul_quant(x, group_size, scale_layout=scale_layout, ue8m0=ue8m0, eps=eps,
                                    **_reference_rows(m_indices, used_rows, masked_m))  # fmt: skip


_silu = Op("silu_mul_quant", ("q", "scale"), _silu_geometry, _silu_launch, _silu_reference)


def _index_tensor(name: str, t, shape: tuple, x: torch.Tensor) -> None:
    if not isinstance(t, torch.Tensor) or t.dtype != torch.int32 or tuple(t.shape) != shape or not t.is_contiguous():
        raise ValueError(f"{name} must be a contiguous int32 tensor of shape {shape}")
    if t.device != x.device:
        raise ValueError(f"{name} is on {t.device}, x on {x.device}: all tensors must be on one device")


def silu_mul_quant(
    x: torch.Tensor,
    group_size: int = 128,
    *,
    scale_layout: str = "mn_tma",
    ue8m0: bool | None = None,
    eps: float = 1e-10,
    m_indices: torch.Tensor | None = None,
    row_offsets: torch.Tensor | None = None,
    masked_m: torch.Tensor | None = None,
    align: int = 128,
    out: tuple[torch.Tensor, torch.Tensor] | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """``silu(gate) * up`` of ``x [M, 2N]`` (or ``[E, max_m, 2N]``), rounded to x's dtype and
    quantized per group into ``q [*, M, N]`` and ``scale`` in ``scale_layout``, in one pass:
    the bytes of ``per_token_group_quant(reference.silu_and_mul(x), ...)`` (docs/contract.md, "MoE").

    Args:
        x: bfloat16, float16 or float32, last dimension contiguous, gate in the first half of each row.
        group_size: 128 (DeepGEMM's groups, the only ones the kernel is built for), on either
            device; :func:`fp8quant.reference.silu_mul_quant` takes 32, 64 or 128.
        m_indices: int32 ``[M]`` of the contiguous MoE layout: rows with -1 are padding.
        row_offsets: the routing's int32 ``[E + 1]`` (with ``m_indices``): rows at or past
            ``row_offsets[E]`` (M_sum) are not read or written, whatever ``m_indices`` holds
            there, so the work follows the tokens, not the bound.
        masked_m: int32 ``[E]`` of the masked layout ``[E, max_m, 2N]``: rows past it are padding.
        align: rows per tile of the masked layout (its padding rows below
            ``align_up(masked_m[e], align)`` get zero scales).
        out: optional ``(q, scale)``, as for :func:`fp8quant.per_token_group_quant`.

    Padding rows are not read and their q bytes are not written; their scales are 0 where a
    grouped GEMM's tile reads them (contiguous: below M_sum; masked: below the tile boundary)
    and untouched past that. The CPU path writes zeros there.
    """
    check_moe_group_size(group_size, "silu_mul_quant")
    _check_silu_input(x, group_size, "group_size")
    check_eps(eps)
    ue8m0 = resolve_ue8m0(scale_layout, ue8m0)
    rows = _silu_rows(x, m_indices, row_offsets, masked_m, align)
    return _silu(x, *rows, align, group_size, scale_layout, ue8m0, float(eps), out=out)


def _check_silu_input(x: torch.Tensor, group: int, group_name: str = "the group size") -> None:
    """x [M, 2N] or [E, max_m, 2N], last dimension contiguous, N a positive multiple of ``group``."""
    if not isinstance(x, torch.Tensor) or x.dtype not in INPUT_DTYPES or x.dim() not in (2, 3) or x.shape[-1] % 2:
        raise TypeError(
            "x must be a bfloat16, float16 or float32 tensor [M, 2N] or [E, max_m, 2N] (even last dimension)"
        )
    n = x.shape[-1] // 2
    if n == 0 or n % group:
        raise ValueError(f"x.shape[-1] / 2 (N={n}) must be a positive multiple of {group_name} ({group})")
    if x.numel() > 0 and x.stride(-1) != 1:
        raise ValueError(f"x must have a contiguous last dimension, got strides {tuple(x.stride())}")


def _silu_rows(x: torch.Tensor, m_indices, row_offsets, masked_m, align: int) -> tuple[torch.Tensor, ...]:
    """The MoE row arguments of the SiLU-and-mul ops, checked: ``(m_indices, used_rows, masked_m)``,
    each an int32 tensor on x's device, empty where not given (used_rows: ``row_offsets[E]``)."""
    if m_indices is not None and masked_m is not None:
        raise ValueError("give m_indices (contiguous layout) or masked_m (masked layout), not both")
    if row_offsets is not None and m_indices is None:
        raise ValueError("row_offsets applies to the contiguous layout: give m_indices with it")
    check_int(align, "align")
    empty = torch.empty(0, dtype=torch.int32, device=x.device)
    for name, t, want in (("m_indices", m_indices, (x.shape[0],) if x.dim() == 2 else None),
                          ("masked_m", masked_m, (x.shape[0],) if x.dim() == 3 else None)):  # fmt: skip
        if t is None:
            continue
        if want is None:
            raise ValueError(f"{name} does not apply to x of shape {tuple(x.shape)}")
        _index_tensor(name, t, want, x)
    used_rows = empty
    if row_offsets is not None:
        if not isinstance(row_offsets, torch.Tensor) or row_offsets.dim() != 1 or row_offsets.numel() < 1:
            raise ValueError("row_offsets must be the routing's int32 tensor [E + 1]")
        _index_tensor("row_offsets", row_offsets, tuple(row_offsets.shape), x)
        used_rows = row_offsets[-1:]
    return empty if m_indices is None else m_indices, used_rows, empty if masked_m is None else masked_m


# --- silu_mul_mxfp8, silu_mul_nvfp4 --------------------------------------------------------------


def _silu_mx_geometry(x: TensorMeta, *rest) -> tuple[Buffer, Buffer]:
    return block_scaled_outputs((*x.shape[:-1], x.shape[-1] // 2), "mxfp8", rest[-1])


def _silu_fp4_geometry(x: TensorMeta, *rest) -> tuple[Buffer, Buffer]:
    return block_scaled_outputs((*x.shape[:-1], x.shape[-1] // 2), "nvfp4", rest[-1])


def _silu_block_launch(entry, x, m_indices, used_rows, masked_m, q, scale, align: int, *tail) -> None:
    """x's rows as [gate | up], n = K / 2 passed apart; ``tail`` ends the C call's arguments."""
    shape, xs, qs = x.shape, x.stride(), q.stride()
    batch, x_batch, q_batch = (1, 0, 0) if len(shape) == 2 else (shape[0], xs[0], qs[0])
    ptr = lambda t: t.data_ptr() if t.numel() else 0
    launch(
        entry, x.get_device(), x.data_ptr(), DTYPE_CODES[x.dtype], batch, shape[-2], shape[-1] // 2, x_batch, xs[-2],
        q.data_ptr(), q_batch, qs[-2], ptr(m_indices), ptr(used_rows), ptr(masked_m), align, scale.data_ptr(), *tail,
    )  # fmt: skip


def _silu_mx_launch(x, m_indices, used_rows, masked_m, q, scale, align, recipe, scale_layout) -> None:
    _silu_block_launch(extension().silu_mul_mxfp8_ptr, x, m_indices, used_rows, masked_m, q, scale, align,
                       MX_LAYOUT_CODES[scale_layout], MX_RECIPE_CODES[recipe])  # fmt: skip


def _silu_fp4_launch(x, m_indices, used_rows, masked_m, global_scale, q, scale, align, scale_layout) -> None:
    _silu_block_launch(extension().silu_mul_nvfp4_ptr, x, m_indices, used_rows, masked_m, q, scale, align,
                       MX_LAYOUT_CODES[scale_layout], global_scale.data_ptr(), global_scale.numel())  # fmt: skip


def _reference_rows(m_indices: torch.Tensor, used_rows: torch.Tensor, masked_m: torch.Tensor) -> dict:
    """The reference's row arguments: rows at or past ``used_rows`` count as padding, whatever
    m_indices holds there (the reference writes zeros wherever the kernel leaves a byte unwritten)."""
    if m_indices.numel() and used_rows.numel():
        rows = torch.arange(m_indices.numel(), device=m_indices.device)
        m_indices = torch.where(rows < used_rows.to(m_indices.device), m_indices, -1)
    return {"m_indices": m_indices if m_indices.numel() else None, "masked_m": masked_m if masked_m.numel() else None}


def _silu_mx_reference(
    x: torch.Tensor, m_indices: torch.Tensor, used_rows: torch.Tensor, masked_m: torch.Tensor, align: int, recipe: str,
    scale_layout: str,
):  # fmt: skip
    return reference.silu_mul_mxfp8(x, recipe=recipe, scale_layout=scale_layout,
                                    **_reference_rows(m_indices, used_rows, masked_m))  # fmt: skip


def _silu_fp4_reference(
    x: torch.Tensor, m_indices: torch.Tensor, used_rows: torch.Tensor, masked_m: torch.Tensor,
    global_scale: torch.Tensor, align: int, scale_layout: str,
):  # fmt: skip
    return reference.silu_mul_nvfp4(x, global_scale, scale_layout=scale_layout,
                                    **_reference_rows(m_indices, used_rows, masked_m))  # fmt: skip


_silu_mx = Op("silu_mul_mxfp8", ("q", "scale"), _silu_mx_geometry, _silu_mx_launch, _silu_mx_reference)
_silu_fp4 = Op("silu_mul_nvfp4", ("q", "scale"), _silu_fp4_geometry, _silu_fp4_launch, _silu_fp4_reference)


def silu_mul_mxfp8(
    x: torch.Tensor,
    *,
    recipe: str = "rceil",
    scale_layout: str = "swizzled",
    m_indices: torch.Tensor | None = None,
    row_offsets: torch.Tensor | None = None,
    masked_m: torch.Tensor | None = None,
    align: int = 128,
    out: tuple[torch.Tensor, torch.Tensor] | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """``silu(gate) * up`` of ``x [M, 2N]`` (or ``[E, max_m, 2N]``), rounded to x's dtype and
    quantized to MXFP8 in one pass: the bytes of ``mxfp8_quant(reference.silu_and_mul(x))``
    (docs/contract.md, "MXFP8").

    Args:
        x: bfloat16, float16 or float32, last dimension contiguous, N a multiple of 32.
        recipe, scale_layout: as :func:`fp8quant.mxfp8_quant`.
        m_indices, row_offsets, masked_m, align: the MoE layouts' rows, as
            :func:`silu_mul_quant` (a tile of the swizzled layout is 128 rows: keep ``align`` a
            multiple of 128 there).
        out: optional ``(q, scale)`` of exactly the shapes and dtypes returned.

    Returns:
        ``(q, scale)``: q float8_e4m3fn ``[*, M, N]``, scale float8_e8m0fnu. Padding rows as
        :func:`silu_mul_quant`: not read, q not written, scale bytes 0 inside a tile, untouched
        past it; the CPU path writes zeros there.

    Example::

        q, scale = fp8quant.silu_mul_mxfp8(y1, masked_m=routing.counts)
    """
    _check_silu_input(x, 32)
    check_mx_options(scale_layout, recipe)
    rows = _silu_rows(x, m_indices, row_offsets, masked_m, align)
    return _silu_mx(x, *rows, align, recipe, scale_layout, out=out)


def silu_mul_nvfp4(
    x: torch.Tensor,
    global_scale: torch.Tensor,
    *,
    scale_layout: str = "swizzled",
    m_indices: torch.Tensor | None = None,
    row_offsets: torch.Tensor | None = None,
    masked_m: torch.Tensor | None = None,
    align: int = 128,
    out: tuple[torch.Tensor, torch.Tensor] | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """``silu(gate) * up`` of ``x [M, 2N]`` (or ``[E, max_m, 2N]``), rounded to x's dtype and
    quantized to NVFP4 in one pass: the bytes of ``nvfp4_quant(reference.silu_and_mul(x),
    global_scale)`` (docs/contract.md, "NVFP4").

    Args:
        x: bfloat16, float16 or float32, last dimension contiguous, N a multiple of 16.
        global_scale: float32 encode scales on x's device (calibrated: the kernel quantizes each
            row as it computes it): ``[]`` for every row, or ``[E]``, one per expert: of each
            batch of the masked layout, or of each row's expert ``m_indices[r]`` in the
            contiguous layout (every expert index below E).
        scale_layout, m_indices, row_offsets, masked_m, align: as :func:`silu_mul_mxfp8`.
        out: optional ``(q, scale)`` of exactly the shapes and dtypes returned.

    Returns:
        ``(q, scale)``: q uint8 ``[*, M, N / 2]`` (two e2m1 codes a byte), scale float8_e4m3fn.

    Example::

        q, scale = fp8quant.silu_mul_nvfp4(y1, a2_global_scale, m_indices=routing.m_indices,
                                           row_offsets=routing.row_offsets)
    """
    _check_silu_input(x, 16)
    check_mx_options(scale_layout)
    rows = _silu_rows(x, m_indices, row_offsets, masked_m, align)
    per_expert = (x.shape[0],) if x.dim() == 3 else None  # masked: one per batch
    if m_indices is not None and isinstance(global_scale, torch.Tensor) and global_scale.dim() == 1:
        per_expert = (max(global_scale.shape[0], 1),)  # contiguous: any number of experts, at least one
    global_scale = check_global_scale(global_scale, x.device, ((),) if per_expert is None else ((), per_expert))
    return _silu_fp4(x, rows[0], rows[1], rows[2], global_scale, align, scale_layout, out=out)


# --- moe_dispatch_quant --------------------------------------------------------------------------


def _dispatch_geometry(
    x: TensorMeta,
    slot_rows: TensorMeta,
    counts: TensorMeta,
    row_offsets: TensorMeta,
    rows: int,
    max_m: int,
    align: int,
    group_size: int,
    scale_layout: str,
    ue8m0: bool,
    eps: float,
) -> tuple[Buffer, Buffer]:
    """q [rows, H] (contiguous, max_m == 0) or [E, max_m, H] (masked); the scale layout's buffer."""
    h = x.shape[-1]
    shape = (rows, h) if max_m == 0 else (counts.shape[0], max_m, h)
    return Buffer(FP8_DTYPE, shape), scale_buffer(scale_layout, shape[-2], h // group_size, tuple(shape[:-2]))


def _dispatch_launch(
    x, slot_rows, counts, row_offsets, q, scale, rows, max_m, align, group_size, scale_layout, ue8m0, eps
) -> None:
    qs = q.stride()
    masked = max_m > 0
    launch(
        extension().moe_dispatch_quant_ptr, x.get_device(), x.data_ptr(), DTYPE_CODES[x.dtype], x.shape[0],
        x.shape[1], x.stride(0), slot_rows.data_ptr(), slot_rows.shape[1], counts.data_ptr(),
        0 if masked else row_offsets.data_ptr(), counts.shape[0], align, rows, max_m, q.data_ptr(),
        qs[0] if masked else 0, qs[-2], scale.data_ptr(), LAYOUT_CODES[scale_layout], ue8m0, group_size, eps,
    )  # fmt: skip


def _dispatch_reference(
    x: torch.Tensor, slot_rows: torch.Tensor, counts: torch.Tensor, row_offsets: torch.Tensor, rows: int, max_m: int, align: int, group_size: int,
    scale_layout: str, ue8m0: bool, eps: float,
):  # fmt: skip
    """The reference writes zeros wherever the kernel leaves a byte unwritten (a valid filling)."""
    shape = (rows,) if max_m == 0 else (counts.shape[0], max_m)
    return reference.moe_scatter_quant(x, slot_rows, shape, group_size, scale_layout=scale_layout, ue8m0=ue8m0, eps=eps)


_dispatch = Op("moe_dispatch_quant", ("q", "scale"), _dispatch_geometry, _dispatch_launch, _dispatch_reference)


def moe_dispatch_quant(
    x: torch.Tensor,
    routing: MoeRouting,
    group_size: int = 128,
    *,
    layout: str = "contiguous",
    max_m: int | None = None,
    align: int = 128,
    scale_layout: str = "mn_tma",
    ue8m0: bool | None = None,
    eps: float = 1e-10,
    out: tuple[torch.Tensor, torch.Tensor] | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Tokens ``x [T, H]`` quantized per group and stored in an expert-grouped layout, in one
    pass: each token read and quantized once, its row stored at each of its slots' rows. The
    bytes of :func:`fp8quant.reference.moe_dispatch_quant` on every row that holds a token
    (docs/contract.md, "MoE").

    Args:
        x: bfloat16, float16 or float32 ``[T, H]``, last dimension contiguous, H a multiple of
            128: exactly the T tokens the routing was made for (``routing.inv_perm`` is
            ``[T, k]``); more or fewer raise ValueError (a shape check: nothing is read back).
        routing: :func:`fp8quant.moe_routing`'s result for these tokens.
        layout: ``"contiguous"`` (q ``[rows, H]``, rows as ``routing.m_indices``) or ``"masked"``
            (q ``[E, max_m, H]``, scales batched per expert; needs a routing made with ``max_m``).
        max_m: rows per expert of the masked layout.
        align: rows per tile of the masked layout (the contiguous layout's tiles are the routing's).
        group_size: 128 (the only groups the kernel is built for), on either device;
            :func:`fp8quant.reference.moe_dispatch_quant` takes 32, 64 or 128.
        out: optional ``(q, scale)``, as for :func:`fp8quant.per_token_group_quant`.

    Rows without a token are padding: their q bytes are not written; their scales are 0 inside
    their expert's tile (the rows a grouped GEMM's tile reads) and untouched past it, so the
    work follows the tokens, not the layout's bound. The CPU path writes zeros there.
    """
    check_moe_group_size(group_size, "moe_dispatch_quant")
    _check_dispatch(x, routing, layout, max_m, align, group_size, "group_size")
    check_eps(eps)
    ue8m0 = resolve_ue8m0(scale_layout, ue8m0)
    slot_rows = routing.masked_row if layout == "masked" else routing.inv_perm
    return _dispatch(
        x, slot_rows, routing.counts, routing.row_offsets, routing.m_indices.numel(),
        max_m if layout == "masked" else 0, align, group_size, scale_layout, ue8m0, float(eps), out=out,
    )  # fmt: skip
