"""Pure-PyTorch reference of every fp8quant op: the oracle the CUDA kernels are tested against,
and the implementation used for CPU tensors.

It follows SPEC.md literally and favours exactness over speed: divisions are done in float64
and rounded once to float32, which equals IEEE float32 division for every input (a float64
quotient of two float32 numbers is never a double-rounding hazard: 53 >= 2*24 + 2).
"""

from __future__ import annotations

import math
from typing import NamedTuple

import torch

from ._checks import (
    FP8_DTYPE,
    check_block_quant_args,
    check_int,
    check_norm_args,
    check_quant_args,
    check_routing_tokens,
    resolve_ue8m0,
)
from .layouts import ScaleSpec, scale_spec

__all__ = [
    "FP8_MAX",
    "MoeRouting",
    "convert_scales",
    "dequantize_blocks",
    "dequantize_groups",
    "inverse_rms",
    "moe_combine",
    "moe_dispatch_quant",
    "moe_routing",
    "moe_scatter_quant",
    "pack_ue8m0",
    "per_block_quant",
    "per_token_group_quant",
    "quantize_groups",
    "requantize_ue8m0",
    "rms_norm",
    "rms_norm_quant",
    "silu_and_mul",
    "silu_mul_quant",
    "sm100_weight_scales",
    "sum_of_squares",
    "ue8m0_round_up",
    "unpack_ue8m0",
]

#: Largest finite float8_e4m3fn value.
FP8_MAX = 448.0
# Byte every NaN input becomes (the canonical NaN of float8_e4m3fn, as the GPU writes it).
_FP8_NAN_BYTE = 0x7F


def ue8m0_round_up(scale: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Round positive float32 scales up to a power of two on their bit pattern.

    Returns ``(scale_pow2, e)``: the rounded float32 scales and their UE8M0 bytes as int32,
    ``e = exponent + (mantissa != 0)`` clamped to ``[1, 254]``.
    """
    bits = scale.view(torch.int32)
    e = (bits >> 23) + ((bits & 0x7FFFFF) != 0).to(torch.int32)
    e = e.clamp(1, 254)
    return (e << 23).view(torch.float32), e


def quantize_groups(
    x: torch.Tensor, group_size: int, *, ue8m0: bool, eps: float
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Quantize ``x [..., K]`` in groups of ``group_size`` along K.

    Returns ``(q, scale, e)``: ``q`` float8_e4m3fn with x's shape, ``scale`` float32
    ``[..., K // group_size]`` (the value each group was divided by) and ``e`` its UE8M0 byte
    as int32 (meaningful when ``ue8m0``).
    """
    k = x.shape[-1]
    xf = x.float().unflatten(-1, (k // group_size, group_size))

    amax = _finite_amax(xf, -1, eps)
    scale, e = _scale_of(amax, ue8m0)
    return _quantize(xf, scale.unsqueeze(-1)).flatten(-2), scale, e


def _finite_amax(xf: torch.Tensor, dims, eps: float) -> torch.Tensor:
    """max(|x|) over the finite elements along ``dims``, at least ``eps`` (SPEC 1, step 1)."""
    finite = torch.isfinite(xf)
    amax = torch.where(finite, xf.abs(), torch.zeros_like(xf)).amax(dims)
    return torch.maximum(amax, torch.full_like(amax, eps))


def _scale_of(amax: torch.Tensor, ue8m0: bool) -> tuple[torch.Tensor, torch.Tensor]:
    """IEEE float32 amax / 448, optionally rounded up to a power of two; and its UE8M0 byte."""
    scale = (amax.double() / FP8_MAX).float()
    if ue8m0:
        return ue8m0_round_up(scale)
    return scale, torch.zeros_like(scale, dtype=torch.int32)


def _quantize(xf: torch.Tensor, scale: torch.Tensor) -> torch.Tensor:
    """IEEE float32 x / scale (``scale`` broadcast against ``xf``), then round-to-nearest-even
    with saturation to float8_e4m3fn; NaN to the canonical NaN byte."""
    q32 = (xf.double() / scale.double()).float()
    q = q32.clamp(-FP8_MAX, FP8_MAX).to(FP8_DTYPE)
    return q.view(torch.uint8).masked_fill(torch.isnan(xf), _FP8_NAN_BYTE).view(FP8_DTYPE)


def _place_scales(values: torch.Tensor, spec: ScaleSpec) -> torch.Tensor:
    """Write ``values`` into a zero-filled buffer of the layout; padding stays 0."""
    out = torch.zeros(spec.numel, dtype=spec.dtype, device=values.device).as_strided(spec.shape, spec.stride)
    return out.copy_(values)


def per_token_group_quant(
    x: torch.Tensor,
    group_size: int = 128,
    *,
    scale_layout: str = "row",
    ue8m0: bool | None = None,
    eps: float = 1e-10,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Reference of :func:`fp8quant.per_token_group_quant` (same arguments, same outputs)."""
    ue8m0 = resolve_ue8m0(scale_layout, ue8m0)
    check_quant_args(x, group_size, eps)
    q, scale, e = quantize_groups(x, group_size, ue8m0=ue8m0, eps=eps)
    spec = scale_spec(scale_layout, x.shape[-2], scale.shape[-1], tuple(x.shape[:-2]))
    if scale_layout != "packed_ue8m0":
        return q.contiguous(), _place_scales(scale, spec)
    return q.contiguous(), _place_scales(_pack_bytes(e, spec.cols), spec)


def _pack_bytes(e: torch.Tensor, words: int) -> torch.Tensor:
    """UE8M0 bytes ``e [..., G]`` (int32) four to an int32 word, little-endian (byte j of word p is
    group 4p + j): ``[..., words]``; the bytes of groups past G are 0."""
    byte = torch.zeros((*e.shape[:-1], 4 * words), dtype=torch.uint8, device=e.device)
    byte[..., : e.shape[-1]] = e.to(torch.uint8)
    shifts = torch.tensor([0, 8, 16, 24], dtype=torch.int64, device=e.device)
    packed = (byte.unflatten(-1, (words, 4)).to(torch.int64) << shifts).sum(-1)
    return torch.where(packed >= 2**31, packed - 2**32, packed).to(torch.int32)


def per_block_quant(
    w: torch.Tensor,
    block_size: tuple[int, int] = (128, 128),
    *,
    ue8m0: bool = False,
    eps: float = 1e-4,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Reference of :func:`fp8quant.per_block_quant` (SPEC.md section 3): ``w [*, N, K]`` in blocks
    of ``block_size = (bn, bk)``, edge blocks partial. Returns ``q`` (float8_e4m3fn, w's shape) and
    the fp32 scales ``[*, ceil(N/bn), ceil(K/bk)]``, contiguous. With ``ue8m0`` each block is
    quantized with its power-of-two scale. Any block size works here; the kernel takes 128 x 128."""
    check_block_quant_args(w, block_size, ue8m0, eps)
    bn, bk = block_size
    n, k = w.shape[-2], w.shape[-1]
    nb, kb = -(-n // bn), -(-k // bk)
    # Zero padding to whole blocks never raises an amax
    xf = torch.zeros((*w.shape[:-2], nb * bn, kb * bk), dtype=torch.float32, device=w.device)
    xf[..., :n, :k] = w.float()
    blocks = xf.unflatten(-1, (kb, bk)).unflatten(-3, (nb, bn))  # [*, nb, bn, kb, bk]
    amax = _finite_amax(blocks, (-3, -1), eps)
    scale, _ = _scale_of(amax, ue8m0)
    q = _quantize(blocks, scale.unsqueeze(-2).unsqueeze(-1))
    q = q.flatten(-2).flatten(-3, -2)[..., :n, :k]
    return q.contiguous(), scale.contiguous()


# --------------------------------------------------------------------------------------------
# Scale transforms (docs/contract.md, "Scale transforms")
# --------------------------------------------------------------------------------------------

_FP32_LAYOUTS = ("row", "mn", "mn_tma")
_UE8M0_SUBNORMAL = 0x00400000  # 2^-127, UE8M0 byte 0, a float32 subnormal


def check_scale_tensor(
    scale: torch.Tensor, layout: str, dtype: torch.dtype, cols: int | None = None, name: str = "scale"
) -> ScaleSpec:
    """``scale`` (the argument ``name``) has ``dtype`` and the shape and strides of ``layout`` (its
    own column count, or ``cols`` groups for a packed tensor); returns its geometry."""
    if not isinstance(scale, torch.Tensor):
        raise TypeError(f"{name} must be a torch.Tensor, got {type(scale).__name__}")
    if scale.dtype != dtype:
        raise TypeError(f"{name} must be {dtype} for layout {layout!r}, got {scale.dtype}")
    if scale.dim() < 2:
        raise ValueError(f"{name} must be [*, M, G], got shape {tuple(scale.shape)}")
    spec = scale_spec(layout, scale.shape[-2], scale.shape[-1] if cols is None else cols, tuple(scale.shape[:-2]))
    if tuple(scale.shape) != spec.shape or any(
        n > 1 and st != want for n, st, want in zip(spec.shape, scale.stride(), spec.stride)
    ):
        raise ValueError(
            f"{name} must have shape {spec.shape} and strides {spec.stride} for layout {layout!r}, "
            f"got {tuple(scale.shape)} and {tuple(scale.stride())}"
        )
    return spec


def convert_scales(scale: torch.Tensor, from_layout: str, to_layout: str) -> torch.Tensor:
    """fp32 scales ``[*, M, G]`` in ``from_layout`` as ``to_layout`` (each of ``"row"``, ``"mn"``,
    ``"mn_tma"``): the same values at the target's strides, over a whole buffer whose padding
    rows are 0 (SPEC 2)."""
    for name, layout in (("from_layout", from_layout), ("to_layout", to_layout)):
        if layout not in _FP32_LAYOUTS:
            raise ValueError(f"{name} must be one of {_FP32_LAYOUTS}, got {layout!r}")
    check_scale_tensor(scale, from_layout, torch.float32)
    spec = scale_spec(to_layout, scale.shape[-2], scale.shape[-1], tuple(scale.shape[:-2]))
    return _place_scales(scale, spec)


def _ue8m0_bytes(scale: torch.Tensor, name: str = "scale") -> torch.Tensor:
    """The UE8M0 byte (int32) of each power-of-two float32 scale; ValueError at the first scale
    that is not 2^k for k in [-127, 127], named as an element of the argument ``name``."""
    bits = scale.contiguous().view(torch.int32)
    normal = ((bits & 0x7FFFFF) == 0) & (bits >= 1 << 23) & (bits < 255 << 23)
    ok = normal | (bits == _UE8M0_SUBNORMAL)
    if not bool(ok.all()):
        first = tuple(int(i) for i in (~ok).nonzero()[0])
        raise ValueError(
            f"{name}{list(first)} = {scale[first].item()!r} is not a power of two in [2^-127, 2^127]: "
            "only UE8M0 values can be packed (quantize with ue8m0=True, or requantize_ue8m0 a weight)"
        )
    return torch.where(bits == _UE8M0_SUBNORMAL, torch.zeros_like(bits), bits >> 23)


def pack_ue8m0(scale: torch.Tensor, from_layout: str = "mn_tma") -> torch.Tensor:
    """Power-of-two fp32 scales ``[*, M, G]`` (any fp32 layout) as packed_ue8m0: int32
    ``[*, M, ceil(G/4)]``, byte j of word p the UE8M0 byte of group 4p + j, TMA-aligned rows,
    padding bytes and rows 0 (SPEC 2). Any other value raises ValueError naming it."""
    if from_layout not in _FP32_LAYOUTS:
        raise ValueError(f"from_layout must be one of {_FP32_LAYOUTS}, got {from_layout!r}")
    check_scale_tensor(scale, from_layout, torch.float32)
    spec = scale_spec("packed_ue8m0", scale.shape[-2], scale.shape[-1], tuple(scale.shape[:-2]))
    return _place_scales(_pack_bytes(_ue8m0_bytes(scale), spec.cols), spec)


def check_packed_tensor(packed: torch.Tensor, num_groups: int) -> None:
    """``packed`` is packed_ue8m0 words ``[*, M, ceil(num_groups / 4)]`` with that layout's strides."""
    if isinstance(num_groups, bool) or not isinstance(num_groups, int) or num_groups < 1:
        raise ValueError(f"num_groups must be an int >= 1, got {num_groups!r}")
    if isinstance(packed, torch.Tensor) and packed.dim() >= 2 and packed.shape[-1] != -(-num_groups // 4):
        raise ValueError(f"packed has {packed.shape[-1]} words a row; {num_groups} groups need {-(-num_groups // 4)}")
    check_scale_tensor(packed, "packed_ue8m0", torch.int32, cols=num_groups, name="packed")


def unpack_ue8m0(packed: torch.Tensor, num_groups: int, to_layout: str = "mn_tma") -> torch.Tensor:
    """The fp32 scales ``2^(e - 127)`` of packed_ue8m0 words ``[*, M, ceil(G/4)]`` for
    ``G = num_groups``, in ``to_layout`` (byte 0 is 2^-127, a float32 subnormal; byte 255, UE8M0's
    NaN, raises ValueError naming its group)."""
    if to_layout not in _FP32_LAYOUTS:
        raise ValueError(f"to_layout must be one of {_FP32_LAYOUTS}, got {to_layout!r}")
    check_packed_tensor(packed, num_groups)
    shifts = torch.tensor([0, 8, 16, 24], dtype=torch.int64, device=packed.device)
    words = packed.to(torch.int64) & 0xFFFFFFFF
    e = ((words.unsqueeze(-1) >> shifts) & 0xFF).flatten(-2)[..., :num_groups].to(torch.int32)
    if bool((e == 255).any()):
        first = [int(i) for i in (e == 255).nonzero()[0]]
        raise ValueError(f"packed holds the UE8M0 NaN byte 0xFF for group {first}")
    bits = torch.where(e == 0, torch.full_like(e, _UE8M0_SUBNORMAL), e << 23)
    spec = scale_spec(to_layout, packed.shape[-2], num_groups, tuple(packed.shape[:-2]))
    return _place_scales(bits.view(torch.float32), spec)


def check_weight_scale_args(w_scale: torch.Tensor, n: int, block_n: int) -> None:
    """``w_scale`` is contiguous float32 ``[*, ceil(n / block_n), kb]`` with kb >= 1."""
    if not isinstance(w_scale, torch.Tensor) or w_scale.dtype != torch.float32 or w_scale.dim() < 2:
        raise TypeError("w_scale must be a float32 tensor [*, ceil(N / block_n), ceil(K / block_k)]")
    if w_scale.shape[-1] < 1 or not w_scale.is_contiguous():
        raise ValueError(f"w_scale must be contiguous with at least one column, got shape {tuple(w_scale.shape)} "
                         f"and strides {tuple(w_scale.stride())}")  # fmt: skip
    if isinstance(block_n, bool) or not isinstance(block_n, int) or block_n < 1:
        raise ValueError(f"block_n must be a positive int, got {block_n!r}")
    if isinstance(n, bool) or not isinstance(n, int) or n < 0 or -(-n // block_n) != w_scale.shape[-2]:
        raise ValueError(f"n must be an int with ceil(n / block_n) == {w_scale.shape[-2]}, got {n!r}")


def sm100_weight_scales(w_scale: torch.Tensor, n: int, block_n: int = 128) -> torch.Tensor:
    """DeepGEMM SM100's form of power-of-two per-block weight scales ``[*, ceil(N/bn), kb]``
    (contiguous fp32, as per_block_quant writes them): row n takes the scales of block
    ``n // block_n``, packed like activation scales: int32 ``[*, N, ceil(kb/4)]``, strides
    ``(1, align(N, 4))`` (SPEC 3)."""
    check_weight_scale_args(w_scale, n, block_n)
    _ue8m0_bytes(w_scale, "w_scale")  # a bad scale is named by its place in w_scale, not in the broadcast rows
    rows = w_scale.repeat_interleave(block_n, dim=-2)[..., :n, :].contiguous()  # [*, N, kb], row layout
    return pack_ue8m0(rows, "row")


def requantize_ue8m0(
    q: torch.Tensor, scale: torch.Tensor, block_size: tuple[int, int] = (128, 128), *, eps: float = 1e-4
) -> tuple[torch.Tensor, torch.Tensor]:
    """An already-quantized per-block weight (``q`` float8_e4m3fn ``[*, N, K]``, ``scale`` fp32
    ``[*, ceil(N/bn), ceil(K/bk)]``, e.g. a DeepSeek-V3 checkpoint's ``weight`` and
    ``weight_scale_inv``) re-quantized with power-of-two scales, the way SGLang and vLLM prepare
    such checkpoints for DeepGEMM on Blackwell: dequantize (``q * s`` in float32, rounded to
    bfloat16), then :func:`per_block_quant` with ``ue8m0=True``. Returns ``(q', s')``."""
    if not isinstance(q, torch.Tensor) or q.dtype != FP8_DTYPE or q.dim() not in (2, 3):
        raise TypeError("q must be a float8_e4m3fn tensor [N, K] or [E, N, K]")
    bn, bk = block_size
    n, k = q.shape[-2], q.shape[-1]
    want = (*q.shape[:-2], -(-n // bn), -(-k // bk))
    if not isinstance(scale, torch.Tensor) or scale.dtype != torch.float32 or tuple(scale.shape) != want:
        raise ValueError(f"scale must be float32 of shape {want} for q {tuple(q.shape)} and blocks {block_size}")
    dequantized = dequantize_blocks(q, scale, (bn, bk)).to(torch.bfloat16)
    return per_block_quant(dequantized, block_size, ue8m0=True, eps=eps)


def dequantize_groups(q: torch.Tensor, scale: torch.Tensor, group_size: int = 128) -> torch.Tensor:
    """float32 ``q * scale`` of ``q [..., K]`` quantized in 1 x ``group_size`` groups, ``scale
    [..., K / group_size]`` in its logical (row-major) order, any strides."""
    return (q.float().unflatten(-1, (-1, group_size)) * scale.unsqueeze(-1)).flatten(-2)


def dequantize_blocks(q: torch.Tensor, scale: torch.Tensor, block: tuple[int, int] = (128, 128)) -> torch.Tensor:
    """float32 ``q * scale`` of ``q [..., N, K]`` quantized in ``block`` = (bn, bk) blocks, ``scale
    [..., ceil(N/bn), ceil(K/bk)]``; edge blocks may be partial. ``bn = 1`` takes one scale row
    per row of q (DeepGEMM SM100's unpacked weight scales)."""
    n, k = q.shape[-2:]
    bn, bk = block
    per_elem = scale.repeat_interleave(bn, dim=-2)[..., :n, :].repeat_interleave(bk, dim=-1)[..., :k]
    return q.float() * per_elem


# --------------------------------------------------------------------------------------------
# MoE: routing metadata, dispatch + quantize, SiLU-and-mul + quantize, combine
# (docs/contract.md, "MoE"). References only; the kernels are issue 14's next step.
# --------------------------------------------------------------------------------------------


class MoeRouting(NamedTuple):
    """Where each routed slot of ``topk_ids [T, k]`` goes, for the ``E`` local experts.

    Slots are taken in flat order ``s = t * k + j``; within an expert, rows follow that order.

    - ``counts`` int32 ``[E]``: slots routed to each local expert (``masked_m`` of the masked
      layout).
    - ``row_offsets`` int32 ``[E + 1]``: first row of each expert in the contiguous layout (a
      multiple of ``align``); ``row_offsets[E]`` is M_sum.
    - ``m_indices`` int32 ``[rows]``: local expert of each contiguous row, -1 on padding rows;
      ``rows`` is M_sum, or ``max_m_sum`` when given (rows past M_sum are padding too).
    - ``row_token`` int32 ``[rows]``: source token of each row, -1 on padding rows.
    - ``inv_perm`` int32 ``[T, k]``: contiguous row of each slot, -1 for a dropped slot (id -1 or
      an expert outside the local range).
    - ``masked_row`` int32 ``[T, k]``: ``e * max_m + rank`` in the masked layout
      ``[E, max_m, H]``, -1 for a dropped slot; None without ``max_m``.
    - ``status`` int32 ``[1]`` or None: the routing kernel's bound check, kept on the device
      (:meth:`check` reads it); None where the routing was checked when it was made.
    - ``max_m``: the masked layout's rows per expert that ``masked_row`` encodes, or None.
    """

    counts: torch.Tensor
    row_offsets: torch.Tensor
    m_indices: torch.Tensor
    row_token: torch.Tensor
    inv_perm: torch.Tensor
    masked_row: torch.Tensor | None
    status: torch.Tensor | None = None
    max_m: int | None = None

    def check(self) -> None:
        """Raise ValueError if a bound given to the routing was too small (slots that did not fit
        were dropped, row -1). Reads the status word from the device: one synchronization, so
        call it outside CUDA graphs, when convenient (after the layer, say)."""
        bits = 0 if self.status is None else int(self.status.item())
        if bits & 1:
            raise ValueError(
                f"max_m_sum={self.m_indices.numel()} is smaller than M_sum={int(self.row_offsets[-1])} "
                "(the rows the routing needs)"
            )
        if bits & 2:
            raise ValueError(f"max_m is smaller than the {int(self.counts.max())} slots of the busiest expert")


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
    if not isinstance(topk_ids, torch.Tensor) or topk_ids.dtype not in (torch.int32, torch.int64) or topk_ids.dim() != 2:
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
    q, scale = per_token_group_quant(
        xr.view(*rows_shape, x.shape[1]), group_size, scale_layout=scale_layout, ue8m0=ue8m0, eps=eps
    )
    return q, _zero_rows(scale, ~filled.view(rows_shape))


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
    q, scale = per_token_group_quant(y, group_size, scale_layout=scale_layout, ue8m0=ue8m0, eps=eps)
    return q, scale if padding is None else _zero_rows(scale, padding)


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


# --- RMSNorm (docs/contract.md, "RMSNorm") --------------------------------------------------------


def sum_of_squares(h: torch.Tensor) -> torch.Tensor:
    """The float32 sum of squares of each row of ``h [M, H]`` (float32 holding 16-bit values, H a
    multiple of 16) in the contract's order: each 16-element slice summed left to right by fused
    multiply-adds (``s = fma(v, v, s)``: one rounding a term); the slice sums, zero-padded to
    ``32 * W`` (W the power of two >= ceil(H / 512)), folded by halves within each run of 32
    (offsets 16, 8, 4, 2, 1), then the W run totals folded by halves."""
    m, n = h.shape[0], h.shape[1] // 16
    # fma(v, v, s) as float64 arithmetic rounded once to float32: v * v is exact in float64 and
    # s + v * v is correctly rounded there, so the float32 rounding of it is fma's (53 >= 2 * 24 + 2)
    squares = h.double().square().view(m, n, 16)
    s = torch.zeros(m, n, dtype=torch.float32, device=h.device)
    for j in range(16):
        s = (s.double() + squares[:, :, j]).float()
    runs = 1 << ((n + 31) // 32 - 1).bit_length()
    s = torch.nn.functional.pad(s, (0, 32 * runs - n)).view(m, runs, 32)
    width = 32
    while width > 1:
        width //= 2
        s = s[:, :, :width] + s[:, :, width : 2 * width]
    s = s[:, :, 0]
    while runs > 1:
        runs //= 2
        s = s[:, :runs] + s[:, runs : 2 * runs]
    return s[:, 0]


def inverse_rms(ss: torch.Tensor, h: int, eps: float) -> torch.Tensor:
    """``r = 1 / sqrt(ss / h + eps)`` of float32 sums of squares, in float32, each step correctly
    rounded on every device as in the kernel (IEEE division, sum, square root and reciprocal; ``h``
    and ``eps`` as float32). The divisions are float64 ones rounded once (module docstring). torch's
    float32 sqrt is not correctly rounded on a CPU (``sqrt(2 + 2^-21)`` comes out an ulp low on an
    AVX-512 build), nor always its float64 one: the float64 root rounded to float32 is within an
    ulp, and comparing v with the squares of the neighbouring float32 midpoints (25 bits, squared
    exactly in float64) settles it."""
    mean = (ss.double() / torch.full_like(ss, h).double()).float()  # a tensor divisor: CUDA multiplies by 1 / h
    v = mean + torch.full_like(mean, eps)  # eps as a float32, the sum IEEE on every device
    root = torch.sqrt(v.double()).float()
    up = torch.nextafter(root, torch.full_like(root, math.inf))
    down = torch.nextafter(root, torch.zeros_like(root))
    above = (root.double() + up.double()) / 2  # the midpoints, exact in float64
    below = (root.double() + down.double()) / 2
    v64 = v.double()
    root = torch.where(v64 > above * above, up, torch.where(v64 < below * below, down, root))
    return torch.reciprocal(root.double()).float()


def rms_norm(
    x: torch.Tensor, weight: torch.Tensor, eps: float = 1e-6, *, residual: torch.Tensor | None = None
) -> torch.Tensor | tuple[torch.Tensor, torch.Tensor]:
    """Reference of :func:`fp8quant.rms_norm`: ``y = rms_norm(h) * weight`` of ``h = x +
    residual`` (or x), in x's dtype (bfloat16 or float16), each step as PyTorch evaluates it on
    tensors of that dtype: the sum in float32 rounded to the dtype; the sum of squares in float32
    (:func:`sum_of_squares`' order); ``r = 1 / sqrt(sum / H + eps)`` (:func:`inverse_rms`);
    ``h * r`` in float32 rounded to the dtype, times the weight, rounded. Returns y, or ``(y, h)``
    with a residual (the residual's new value; this reference writes nothing in place)."""
    check_norm_args(x, weight, eps, residual)
    h = x if residual is None else (x.float() + residual.float()).to(x.dtype)
    hf = h.float()
    r = inverse_rms(sum_of_squares(hf), x.shape[1], eps)
    y = (hf * r.unsqueeze(1)).to(x.dtype) * weight
    return y if residual is None else (y, h)


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
) -> tuple[torch.Tensor, ...]:
    """Reference of :func:`fp8quant.rms_norm_quant`: :func:`per_token_group_quant` of
    :func:`rms_norm`'s y. Returns ``(q, scale)``, or ``(q, scale, h)`` with a residual."""
    check_quant_args(x, group_size, quant_eps, "quant_eps")
    out = rms_norm(x, weight, eps, residual=residual)
    y = out if residual is None else out[0]
    q, scale = per_token_group_quant(y, group_size, scale_layout=scale_layout, ue8m0=ue8m0, eps=quant_eps)
    return (q, scale) if residual is None else (q, scale, out[1])
