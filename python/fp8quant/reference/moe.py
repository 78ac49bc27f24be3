"""References of the MoE ops (docs/contract.md, "MoE"): routing metadata, dispatch + quantize
(FP8 groups, NVFP4 with per-expert encode scales), SiLU-and-mul + quantize (FP8 groups, MXFP8,
NVFP4), combine."""

from __future__ import annotations

import math

import torch

from .._checks import check_int, check_masked_max_m, check_quant_args, check_routing_tokens
from ..routing import MoeRouting
from .mx import mxfp8_quant
from .nvfp4 import _quantize_rows, nvfp4_quant
from .quant import per_token_group_quant


def moe_routing(
    topk_ids: torch.Tensor,
    num_experts: int,
    *,
    expert_offset: int = 0,
    align: int = 128,
    max_m_sum: int | None = None,
    max_m: int | None = None,
) -> MoeRouting:
    """Routing metadata of ``topk_ids [T, k]`` (int32 or int64; -1 drops a slot) for the local
    experts ``expert_offset .. expert_offset + num_experts - 1`` (ids outside that range belong
    to other ranks and are dropped here). Each expert's contiguous rows start at a multiple of
    ``align``. ``max_m_sum`` fixes the number of contiguous rows (an upper bound on M_sum, so that
    a GPU caller needs no device-to-host read); ``max_m`` sizes the masked layout. A bound that
    is too small raises ValueError. See :class:`MoeRouting` for the outputs."""
    if (
        not isinstance(topk_ids, torch.Tensor)
        or topk_ids.dtype not in (torch.int32, torch.int64)
        or topk_ids.dim() != 2
    ):
        raise TypeError("topk_ids must be an int32 or int64 tensor [T, k]")
    check_int(num_experts, "num_experts")
    check_int(expert_offset, "expert_offset", 0)
    check_int(align, "align")
    check_int(max_m_sum, "max_m_sum", 0, allow_none=True)
    check_int(max_m, "max_m", allow_none=True)
    device, (t, k), e = topk_ids.device, topk_ids.shape, num_experts
    ids = topk_ids.reshape(-1).to(torch.int64)
    local = ids - expert_offset
    valid = (ids >= 0) & (local >= 0) & (local < e)
    expert = torch.where(valid, local, torch.full_like(local, e))  # e: the bucket of dropped slots

    # Counts, aligned row offsets, and each slot's rank within its expert (flat order)
    counts = torch.bincount(expert, minlength=e + 1)[:e]
    aligned = (counts + align - 1) // align * align
    row_offsets = torch.zeros(e + 1, dtype=torch.int64, device=device)
    row_offsets[1:] = torch.cumsum(aligned, 0)
    order = torch.argsort(expert, stable=True)
    first_slot = torch.zeros(e + 1, dtype=torch.int64, device=device)
    first_slot[1:] = torch.cumsum(counts, 0)
    rank = torch.empty_like(expert)
    rank[order] = torch.arange(expert.numel(), device=device) - first_slot[expert[order]]

    # Contiguous layout
    m_sum = int(row_offsets[-1])
    rows = m_sum if max_m_sum is None else max_m_sum
    if m_sum > rows:
        raise ValueError(f"max_m_sum={max_m_sum} is smaller than M_sum={m_sum} (rows, {align}-aligned per expert)")
    row = torch.where(valid, row_offsets[expert.clamp(max=e - 1)] + rank, torch.full_like(rank, -1))
    m_indices = torch.full((rows,), -1, dtype=torch.int32, device=device)
    row_token = torch.full((rows,), -1, dtype=torch.int32, device=device)
    slots = valid.nonzero().squeeze(1)
    m_indices[row[slots]] = expert[slots].to(torch.int32)
    row_token[row[slots]] = (slots // k).to(torch.int32)

    # Masked layout
    masked_row = None
    if max_m is not None:
        if counts.numel() and int(counts.max()) > max_m:
            raise ValueError(f"max_m={max_m} is smaller than the {int(counts.max())} slots of the busiest expert")
        masked_row = torch.where(valid, expert * max_m + rank, torch.full_like(rank, -1)).to(torch.int32).view(t, k)
    return MoeRouting(
        counts.to(torch.int32), row_offsets.to(torch.int32), m_indices, row_token,
        row.to(torch.int32).view(t, k), masked_row, None, max_m,
    )  # fmt: skip


def _zero_rows(scale: torch.Tensor, padding: torch.Tensor) -> torch.Tensor:
    """Zero the scales of padding rows (``padding`` bool ``[*, M]``) in any layout's view."""
    scale[padding] = 0
    return scale


def moe_dispatch_quant(
    x: torch.Tensor,
    routing: MoeRouting,
    group_size: int = 128,
    *,
    layout: str = "contiguous",
    max_m: int | None = None,
    scale_layout: str = "mn_tma",
    ue8m0: bool | None = None,
    eps: float = 1e-10,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Tokens ``x [T, H]`` permuted into an expert-grouped layout and quantized per group.

    ``layout="contiguous"``: q ``[rows, H]`` (row r holds token ``routing.row_token[r]``) and the
    scales of ``scale_layout`` for ``rows`` rows. ``layout="masked"``: q ``[E, max_m, H]`` (row
    ``rank`` of expert e holds its rank-th slot) and batched scales, one TMA-aligned block per
    expert (SPEC.md section 2). Padding rows (no token) are zero here, data and scales alike; the
    kernel writes only their scales inside a tile (docs/contract.md, "Rows without a token").
    ``x`` holds exactly the T tokens the routing was made for; more or fewer raise ValueError."""
    if layout not in ("contiguous", "masked"):
        raise ValueError(f"layout must be 'contiguous' or 'masked', got {layout!r}")
    check_quant_args(x, group_size, eps)
    if x.dim() != 2:
        raise ValueError(f"x must be [T, H], got shape {tuple(x.shape)}")
    check_routing_tokens(x, routing)
    if layout == "contiguous":
        return moe_scatter_quant(
            x, routing.inv_perm, (routing.m_indices.numel(),), group_size, scale_layout=scale_layout, ue8m0=ue8m0,
            eps=eps,
        )  # fmt: skip
    if routing.masked_row is None or max_m is None:
        raise ValueError("layout='masked' needs max_m, and a routing made with the same max_m")
    check_masked_max_m(routing, max_m)
    return moe_scatter_quant(
        x, routing.masked_row, (routing.counts.numel(), max_m), group_size, scale_layout=scale_layout, ue8m0=ue8m0,
        eps=eps,
    )  # fmt: skip


def moe_scatter_quant(
    x: torch.Tensor,
    slot_rows: torch.Tensor,
    rows_shape: tuple[int, ...],
    group_size: int = 128,
    *,
    scale_layout: str = "mn_tma",
    ue8m0: bool | None = None,
    eps: float = 1e-10,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Each token of ``x [T, H]`` quantized per group at the row of each of its slots:
    ``slot_rows [T, k]`` holds flat rows of a layout of ``rows_shape`` rows (``(rows,)``
    contiguous, ``(E, max_m)`` masked, rows ``e * max_m + rank``); -1, or a row outside the
    layout, drops the slot. Rows without a token are zero, data and scales (the kernels write only
    their scales inside a tile)."""
    check_quant_args(x, group_size, eps)
    xr, filled = _scatter_rows(x, slot_rows, rows_shape)
    q, scale = per_token_group_quant(xr, group_size, scale_layout=scale_layout, ue8m0=ue8m0, eps=eps)
    return q, _zero_rows(scale, ~filled)


def moe_dispatch_nvfp4(
    x: torch.Tensor,
    routing: MoeRouting,
    global_scale: torch.Tensor,
    *,
    layout: str = "contiguous",
    max_m: int | None = None,
    scale_layout: str = "swizzled",
) -> tuple[torch.Tensor, torch.Tensor]:
    """Tokens ``x [T, H]`` permuted into an expert-grouped layout as :func:`moe_dispatch_quant`
    does, each row quantized to NVFP4 with the encode scale of its expert (``global_scale``
    float32 ``[]`` for all, or ``[E]``). Rows without a token are zero, data and scale bytes."""
    if layout not in ("contiguous", "masked"):
        raise ValueError(f"layout must be 'contiguous' or 'masked', got {layout!r}")
    check_routing_tokens(x, routing)
    if layout == "contiguous":
        return moe_scatter_nvfp4(x, routing.inv_perm, (routing.m_indices.numel(),), global_scale,
                                 row_experts=routing.m_indices, scale_layout=scale_layout)  # fmt: skip
    if routing.masked_row is None or max_m is None:
        raise ValueError("layout='masked' needs max_m, and a routing made with the same max_m")
    check_masked_max_m(routing, max_m)
    return moe_scatter_nvfp4(x, routing.masked_row, (routing.counts.numel(), max_m), global_scale,
                             scale_layout=scale_layout)  # fmt: skip


def moe_scatter_nvfp4(
    x: torch.Tensor,
    slot_rows: torch.Tensor,
    rows_shape: tuple[int, ...],
    global_scale: torch.Tensor,
    *,
    row_experts: torch.Tensor | None = None,
    scale_layout: str = "swizzled",
) -> tuple[torch.Tensor, torch.Tensor]:
    """:func:`moe_scatter_quant`'s rows in NVFP4: each row with the encode scale of its expert,
    ``global_scale[e]`` of ``[E]`` (masked ``rows_shape (E, max_m)``: a row's expert is its
    batch; contiguous: ``row_experts[r]``, the routing's m_indices), or the one ``[]``."""
    xr, _ = _scatter_rows(x, slot_rows, rows_shape)
    g = global_scale.float().to(x.device)
    if g.dim() == 1 and len(rows_shape) == 1:
        if row_experts is None:
            raise ValueError("one encode scale per expert in the contiguous layout needs row_experts (m_indices)")
        return _quantize_rows(xr, _expert_scales(g, row_experts), scale_layout)
    return nvfp4_quant(xr, g, scale_layout=scale_layout)[:2]


def _expert_scales(global_scale: torch.Tensor, experts: torch.Tensor) -> torch.Tensor:
    """The encode scale of each row's expert, ``global_scale [E]`` at ``experts [M]``, each index
    clamped into ``[0, E - 1]`` as the kernels' ``encode_scale`` clamps it (a padding row's -1
    reads scale 0, an id past the scales given the last): an index the scales do not cover
    reads a wrong scale, never past them (docs/contract.md, "NVFP4")."""
    index = experts.to(global_scale.device).long().clamp(0, global_scale.numel() - 1)
    return global_scale[index]


def _scatter_rows(x: torch.Tensor, slot_rows: torch.Tensor, rows_shape: tuple) -> tuple[torch.Tensor, torch.Tensor]:
    """Token rows of ``x [T, H]`` at their slots' flat rows of a ``rows_shape`` layout: the rows
    ``[*rows_shape, H]`` (zero where no slot lands) and whether each holds a token."""
    if x.dim() != 2:
        raise ValueError(f"x must be [T, H], got shape {tuple(x.shape)}")
    if slot_rows.dim() != 2 or slot_rows.shape[0] != x.shape[0]:
        raise ValueError(f"slot_rows must be [T, k] for x's T = {x.shape[0]} tokens, got {tuple(slot_rows.shape)}")
    total = math.prod(rows_shape)
    dest = slot_rows.reshape(-1).to(x.device).long()
    token = torch.arange(dest.numel(), device=x.device) // max(slot_rows.shape[-1], 1)
    keep = (dest >= 0) & (dest < total)
    xr = torch.zeros((total, x.shape[1]), dtype=x.dtype, device=x.device)
    filled = torch.zeros(total, dtype=torch.bool, device=x.device)
    xr[dest[keep]] = x[token[keep]]
    filled[dest[keep]] = True
    return xr.view(*rows_shape, x.shape[1]), filled.view(rows_shape)


def silu_and_mul(x: torch.Tensor) -> torch.Tensor:
    """``silu(gate) * up`` of ``x [..., 2N]`` (gate the first half), in x's dtype, exactly as
    PyTorch computes ``F.silu(gate) * up``: silu in float32 (``g / (1 + exp(-g))``) rounded to the
    dtype, then the product in float32 rounded to the dtype (docs/contract.md, "MoE")."""
    n = x.shape[-1] // 2
    return torch.nn.functional.silu(x[..., :n]) * x[..., n:]


def silu_mul_quant(
    x: torch.Tensor,
    group_size: int = 128,
    *,
    scale_layout: str = "mn_tma",
    ue8m0: bool | None = None,
    eps: float = 1e-10,
    m_indices: torch.Tensor | None = None,
    masked_m: torch.Tensor | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """``per_token_group_quant(silu_and_mul(x))`` for ``x [M, 2N]`` (plain, or the contiguous
    layout with ``m_indices``: rows whose entry is -1 are padding) or ``x [E, max_m, 2N]`` with
    ``masked_m`` (rows past ``masked_m[e]`` are padding). Padding rows come out zero, data and
    scales, whatever x holds there."""
    y, padding = _silu_rows(x, m_indices, masked_m)
    q, scale = per_token_group_quant(y, group_size, scale_layout=scale_layout, ue8m0=ue8m0, eps=eps)
    return q, scale if padding is None else _zero_rows(scale, padding)


def silu_mul_mxfp8(
    x: torch.Tensor,
    *,
    recipe: str = "rceil",
    scale_layout: str = "swizzled",
    m_indices: torch.Tensor | None = None,
    masked_m: torch.Tensor | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """``mxfp8_quant(silu_and_mul(x))``, rows as :func:`silu_mul_quant` (padding rows zero: their
    amax is 0, so are their elements and scale bytes)."""
    y, _ = _silu_rows(x, m_indices, masked_m)
    return mxfp8_quant(y, recipe=recipe, scale_layout=scale_layout)


def silu_mul_nvfp4(
    x: torch.Tensor,
    global_scale: torch.Tensor,
    *,
    scale_layout: str = "swizzled",
    m_indices: torch.Tensor | None = None,
    masked_m: torch.Tensor | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """``nvfp4_quant(silu_and_mul(x), global_scale)``, rows as :func:`silu_mul_quant`. The encode
    scale: float32 ``[]`` for every row, ``[E]`` per expert: of each batch of the masked layout, or
    of each row's expert ``m_indices[r]`` in the contiguous layout."""
    y, _ = _silu_rows(x, m_indices, masked_m)
    g = global_scale.float()
    if m_indices is not None and g.dim() == 1:
        return _quantize_rows(y, _expert_scales(g, m_indices), scale_layout)
    return nvfp4_quant(y, g, scale_layout=scale_layout)[:2]


def _silu_rows(
    x: torch.Tensor, m_indices: torch.Tensor | None, masked_m: torch.Tensor | None
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """``silu_and_mul(x)`` with its padding rows zeroed, and the padding (bool ``[*, M]``, None
    without an MoE layout)."""
    if not isinstance(x, torch.Tensor) or x.dim() not in (2, 3) or x.shape[-1] % 2:
        raise ValueError("x must be [M, 2N] or [E, max_m, 2N] with an even last dimension")
    if (m_indices is not None) + (masked_m is not None) > 1:
        raise ValueError("give m_indices (contiguous layout) or masked_m (masked layout), not both")
    y = silu_and_mul(x)
    padding = None
    if m_indices is not None:
        if x.dim() != 2 or m_indices.shape != (x.shape[0],):
            raise ValueError(f"m_indices must be [M] for x [M, 2N], got {tuple(m_indices.shape)} for {tuple(x.shape)}")
        padding = m_indices.to(x.device) < 0
    elif masked_m is not None:
        if x.dim() != 3 or masked_m.shape != (x.shape[0],):
            raise ValueError(f"masked_m must be [E] for x [E, max_m, 2N], got {tuple(masked_m.shape)}")
        padding = torch.arange(x.shape[1], device=x.device) >= masked_m.to(x.device).unsqueeze(1)
    if padding is not None:
        y = y.masked_fill(padding.unsqueeze(-1), 0)
    return y, padding


def moe_combine(y: torch.Tensor, rows: torch.Tensor, weights: torch.Tensor) -> torch.Tensor:
    """``out[t] = sum_j weights[t, j] * y[rows[t, j]]`` over ``j = 0 .. k-1`` in that order, in
    float32 (each product and each sum rounded, no fused multiply-add), rounded once to y's dtype.

    ``y``: expert outputs ``[M_sum, H]`` (contiguous layout; ``rows`` = ``routing.inv_perm``) or
    ``[E, max_m, H]`` (masked; ``rows`` = ``routing.masked_row``, indexing the flattened rows).
    A row outside ``[0, rows of y)``, such as the -1 of a dropped slot, contributes nothing.
    ``weights``: ``[T, k]``, any float dtype."""
    flat = y.reshape(-1, y.shape[-1])
    if rows.dim() != 2 or weights.shape != rows.shape:
        raise ValueError(f"rows and weights must both be [T, k], got {tuple(rows.shape)} and {tuple(weights.shape)}")
    out = torch.zeros((rows.shape[0], flat.shape[1]), dtype=torch.float32, device=y.device)
    for j in range(rows.shape[1] if flat.shape[0] else 0):
        r = rows[:, j].long()
        keep = ((r >= 0) & (r < flat.shape[0])).unsqueeze(1)
        term = weights[:, j].float().unsqueeze(1) * flat[r.clamp(0, max(flat.shape[0] - 1, 0))].float()
        out = torch.where(keep, out + term, out)
    return out.to(y.dtype)
