"""Expert parallelism over ``torch.distributed``: each rank holds ``E / world`` of the experts
(rank r the global ids ``r * E/world .. (r + 1) * E/world - 1``), sends its tokens to the ranks
holding their experts and gets the experts' outputs back (docs/expert_parallel.md).

    dist.init_process_group("nccl")                      # or "gloo" with CPU tensors
    out = ep_moe_layer(x, topk_ids, topk_weights, w13_local, w2_local)                  # prefill
    out = ep_moe_layer(x, topk_ids, topk_weights, w13_local, w2_local, max_tokens_per_rank=128)  # decode

    # the same in three steps, with any local experts in between (fp8quant.expert_ffn here)
    sent = ep_dispatch(x, topk_ids, num_experts=256, mode="low_latency", max_tokens_per_rank=128, layout="masked")
    y = expert_ffn(sent.q, sent.scale, sent.routing, w13_local, w2_local, layout="masked")
    out = ep_combine(y, sent.handle, topk_weights)

**Dispatch** quantizes each token once on its own rank (``per_token_group_quant``, 1 x 128 groups,
float32 scales) and sends it once to each rank that holds one of its experts: a row of
:class:`WireFormat` (FP8 data, scales, the token's top-k ids on that rank, -1 elsewhere). The
receiving rank routes what it got (:func:`fp8quant.moe_routing` with its ``expert_offset``) and
stores each row at its slots' rows of the contiguous or masked layout: the bytes
:func:`fp8quant.moe_dispatch_quant` writes for these tokens, since quantizing a token commutes with
copying its row (padding rows: zero scales; q zero on the CPU and not written on the GPU, as the
kernels' contract has it). ``wire="bf16"`` sends the tokens unquantized and quantizes them on the
receiving rank with :func:`fp8quant.moe_dispatch_quant`: the same bytes, twice the data on the wire.

**Combine** sends each slot's expert output row back to the token's rank (not summed on the
expert's rank), where :func:`fp8quant.moe_combine` weights and sums them in slot order: the
single-process layer's float32 sum, rounded once. The result equals, bit for bit, the single-process
layer (``fp8quant.moe_layer``) of all experts on all ranks' tokens, run by the same backend.

**Modes.** ``"normal"`` (prefill): the ranks first exchange how many tokens and slots each sends
each (one device-to-host read: the split sizes of the variable all-to-alls), then send exactly
those rows. ``"low_latency"`` (decode): every rank sends every peer a fixed block of
``max_tokens_per_rank`` rows (a static bound, the same on every rank) whether they hold tokens or
not; unused rows carry ids -1 and are dropped on arrival, so nothing is counted or read back on
the host: the path can be captured in a CUDA graph (with the DeepGEMM or Triton backend).

Ranks in a group must agree on ``num_experts``, ``mode``, ``wire``, ``max_tokens_per_rank``, H and
k; T may differ (also 0). Arguments are checked before any communication, so a rank that raises
leaves the others waiting in the collective, as in any ``torch.distributed`` program.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import NamedTuple

import torch
import torch.distributed as dist

from . import grouped_gemm
from ._checks import INPUT_DTYPES
from .gemm import _have_deep_gemm
from .layouts import align as align_up
from .moe import moe_bounds, moe_combine, moe_dispatch_quant, moe_routing
from .moe_layer import ALIGN, ExpertWeights, check_expert_weights, expert_ffn, segment_align
from .pack import convert_scales
from .quant import per_token_group_quant
from .routing import MoeRouting

__all__ = ["MODES", "WIRES", "EpDispatch", "EpHandle", "WireFormat", "ep_combine", "ep_dispatch", "ep_moe_layer"]

MODES = ("normal", "low_latency")
WIRES = ("fp8", "bf16")
LAYOUTS = ("contiguous", "masked")
BACKENDS = ("deep_gemm", "triton", "reference")

_GROUP = 128  # the quantizer's groups: DeepGEMM's 1 x 128 activation scales
_ROW_ALIGN = 16  # wire rows are padded to 16 bytes (vector loads, the dispatch kernel's rows)
_FP8 = torch.float8_e4m3fn


# --- The wire ------------------------------------------------------------------------------------


@dataclass(frozen=True)
class WireFormat:
    """The row one token sends to one rank: its data, then its top-k ids (int32: the global ids of
    the receiving rank's experts, -1 for slots elsewhere), padded to 16 bytes.

    ``wire="fp8"``: H float8_e4m3fn bytes, then H/128 float32 scales (the quantizer's ``"row"``
    layout); ``"bf16"``: the 2H bytes of the bfloat16 token. DeepSeek-V3 (H = 7168, k = 8): 7424
    bytes a row in FP8, 14368 in bf16.
    """

    wire: str
    hidden: int
    top_k: int

    @property
    def data_bytes(self) -> int:
        return self.hidden if self.wire == "fp8" else 2 * self.hidden

    @property
    def scale_bytes(self) -> int:
        return 4 * (self.hidden // _GROUP) if self.wire == "fp8" else 0

    @property
    def ids_offset(self) -> int:
        return self.data_bytes + self.scale_bytes

    @property
    def row_bytes(self) -> int:
        return align_up(self.ids_offset + 4 * self.top_k, _ROW_ALIGN)

    def fields(self, rows: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor | None, torch.Tensor]:
        """Views of the fields of wire rows ``[n, row_bytes]`` (uint8): the data (uint8
        ``[n, data_bytes]``), the scales (float32 ``[n, H/128]``, None for bf16) and the ids
        (int32 ``[n, k]``)."""
        data = rows[:, : self.data_bytes]
        scale = rows[:, self.data_bytes : self.ids_offset].view(torch.float32) if self.scale_bytes else None
        return data, scale, rows[:, self.ids_offset : self.ids_offset + 4 * self.top_k].view(torch.int32)

    def pack(self, x: torch.Tensor, ids: torch.Tensor) -> torch.Tensor:
        """The rows of the T tokens ``x [T, H]`` (quantized here for ``"fp8"``) with all their
        expert ids ``ids [T, k]`` (:func:`ep_dispatch` keeps, in each row it sends, the receiving
        rank's only), and an empty row T after them (data and scales 0, ids -1) for the rows that
        carry no token: uint8 ``[T + 1, row_bytes]``."""
        t = x.shape[0]
        rows = torch.empty((t + 1, self.row_bytes), dtype=torch.uint8, device=x.device)
        data, scale, wire_ids = self.fields(rows)
        if self.wire == "fp8":
            s = torch.empty((t, self.hidden // _GROUP), dtype=torch.float32, device=x.device)
            per_token_group_quant(x, _GROUP, scale_layout="row", out=(data[:t].view(_FP8), s))
            scale[:t] = s
        else:
            data[:t] = x.view(torch.uint8)
        wire_ids[:t] = ids
        rows[t] = 0
        wire_ids[t] = -1
        return rows


# --- Results -------------------------------------------------------------------------------------


class EpHandle(NamedTuple):
    """What :func:`ep_combine` needs from :func:`ep_dispatch`: on the token's side, where each slot's
    output arrives; on the expert's side, which rows go back to whom; and the bytes each all-to-all
    puts on the wire (to other ranks; a rank's rows to itself are a local copy)."""

    group: object  # the process group (None: the default group)
    layout_shape: tuple[int, ...]  # rows of the dispatched layout: (rows,) or (E_local, max_m)
    combine_rows: torch.Tensor  # int32 [T, k]: row of each slot's output among the rows received back, -1 dropped
    return_rows: torch.Tensor  # int64 [R]: flat layout row of each expert-output row sent back
    return_splits: list[int] | None  # rows sent back to each rank (None: equal blocks, low latency)
    combine_splits: list[int] | None  # rows received back from each rank
    combine_recv_rows: int  # rows received back in all
    dispatch_bytes: int  # bytes this rank's dispatch sends to other ranks (counts included)
    combine_peer_rows: int  # expert-output rows this rank's combine sends to other ranks

    def combine_bytes(self, y: torch.Tensor) -> int:
        """Bytes this rank's :func:`ep_combine` of ``y`` sends to other ranks."""
        return self.combine_peer_rows * y.shape[-1] * y.element_size()


class EpDispatch(NamedTuple):
    """:func:`ep_dispatch`'s result: the rows this rank's experts compute, as
    :func:`fp8quant.moe_dispatch_quant` lays them out, and the handle :func:`ep_combine` takes."""

    q: torch.Tensor  # float8_e4m3fn [rows, H] (contiguous layout) or [E_local, max_m, H] (masked)
    scale: torch.Tensor  # float32 mn_tma scales of q
    routing: MoeRouting  # the local routing of the received tokens (counts, m_indices, ...)
    handle: EpHandle


class _Splits(NamedTuple):
    """Rows each rank sends each peer in the two all-to-alls, as host ints (normal mode): tokens
    out and in (dispatch), slots out and in (combine: the expert's rank sends back the slots it
    received). None in the low-latency mode, whose blocks are equal."""

    tokens_out: list[int] | None = None
    tokens_in: list[int] | None = None
    slots_out: list[int] | None = None
    slots_in: list[int] | None = None


# --- Checks --------------------------------------------------------------------------------------


def _process_group(group) -> tuple[int, int]:
    """This process's rank in ``group`` and the group's size."""
    if not (dist.is_available() and dist.is_initialized()):
        raise RuntimeError(
            "group: torch.distributed is not initialized; call torch.distributed.init_process_group first"
        )
    rank = dist.get_rank(group)
    if rank < 0:
        raise ValueError("group: this process is not a member of the group")
    return rank, dist.get_world_size(group)


def _check_dispatch_args(x, topk_ids, num_experts, world, mode, layout, max_tokens_per_rank, align, wire) -> None:
    if mode not in MODES:
        raise ValueError(f"mode must be one of {MODES}, got {mode!r}")
    if layout not in LAYOUTS:
        raise ValueError(f"layout must be one of {LAYOUTS}, got {layout!r}")
    if wire not in WIRES:
        raise ValueError(f"wire must be one of {WIRES}, got {wire!r}")
    if not isinstance(x, torch.Tensor) or x.dim() != 2 or x.dtype not in (torch.bfloat16, torch.float16, torch.float32):
        raise TypeError("x must be a bfloat16, float16 or float32 tensor [T, H]")
    if wire == "bf16" and x.dtype != torch.bfloat16:
        raise TypeError(f"wire='bf16' sends x as it is: x must be bfloat16, got {x.dtype}")
    if x.shape[1] == 0 or x.shape[1] % _GROUP:
        raise ValueError(f"x.shape[1] (H={x.shape[1]}) must be a positive multiple of {_GROUP}")
    if x.numel() and x.stride(1) != 1:
        raise ValueError(f"x must have a contiguous last dimension, got strides {tuple(x.stride())}")
    if (
        not isinstance(topk_ids, torch.Tensor)
        or topk_ids.dim() != 2
        or topk_ids.dtype not in (torch.int32, torch.int64)
        or topk_ids.shape[1] < 1
    ):
        raise TypeError("topk_ids must be an int32 or int64 tensor [T, k], k >= 1")
    if topk_ids.shape[0] != x.shape[0]:
        raise ValueError(f"topk_ids has {topk_ids.shape[0]} tokens, x {x.shape[0]}: one row of ids per token")
    if topk_ids.device != x.device:
        raise ValueError(f"topk_ids is on {topk_ids.device}, x on {x.device}")
    if isinstance(num_experts, bool) or not isinstance(num_experts, int) or num_experts < 1 or num_experts % world:
        raise ValueError(f"num_experts must be a positive multiple of the group's {world} ranks, got {num_experts!r}")
    if isinstance(align, bool) or not isinstance(align, int) or align < 1:
        raise ValueError(f"align must be an int >= 1, got {align!r}")
    if mode == "normal":
        if max_tokens_per_rank is not None:
            raise ValueError("max_tokens_per_rank is the low-latency mode's bound: give mode='low_latency' with it")
        return
    if isinstance(max_tokens_per_rank, bool) or not isinstance(max_tokens_per_rank, int) or max_tokens_per_rank < 1:
        raise ValueError(f"mode='low_latency' needs max_tokens_per_rank, an int >= 1, got {max_tokens_per_rank!r}")
    if x.shape[0] > max_tokens_per_rank:
        raise ValueError(f"max_tokens_per_rank={max_tokens_per_rank} is smaller than this rank's {x.shape[0]} tokens")


# --- Dispatch ------------------------------------------------------------------------------------


def _kept_ids(topk_ids: torch.Tensor, num_experts: int) -> torch.Tensor:
    """int32 ``[T, k]``: each slot's global expert id, -1 for a dropped slot (any id outside
    ``0 .. num_experts - 1``)."""
    ids = topk_ids.long()
    return torch.where((ids >= 0) & (ids < num_experts), ids, -1).to(torch.int32)


def _token_ranks(slot_ranks: torch.Tensor, world: int) -> torch.Tensor:
    """int32 ``[T, world]``: entry r is r when the token has a slot on rank r, else -1: the token's
    destinations, each once."""
    ranks = torch.arange(world, dtype=torch.int32, device=slot_ranks.device)
    hit = (slot_ranks.unsqueeze(-1) == ranks).any(1)
    return torch.where(hit, ranks, -1)


def _rank_routing(ranks: torch.Tensor, world: int, block: int | None) -> MoeRouting:
    """The routing of ``ranks [T, c]`` with the ranks as its experts (align 1): its
    ``inv_perm`` places each entry in rank order, then in flat order (the rows of a variable
    all-to-all); with ``block``, its ``masked_row`` at ``rank * block + i`` (equal blocks)."""
    return moe_routing(ranks, world, align=1, max_m_sum=ranks.numel(), max_m=block)


def _invert(rows: torch.Tensor, size: int, fill: int) -> torch.Tensor:
    """For each of ``size`` rows, the flat index of the entry of ``rows [N, c]`` placed there (a
    routing's slot -> row map inverted); ``fill`` for rows no entry reaches. Entries of -1 are
    scattered to an extra last row and dropped: nothing is read back to the host."""
    flat = rows.reshape(-1).long()
    out = torch.full((size + 1,), fill, dtype=torch.long, device=rows.device)
    out.scatter_(0, torch.where(flat >= 0, flat, size), torch.arange(flat.numel(), device=rows.device))
    return out[:size]


def _send_rows(fmt: WireFormat, wire_rows: torch.Tensor, tokens: MoeRouting, low_latency: bool, size: int,
               local: int) -> torch.Tensor:  # fmt: skip
    """The dispatch's send buffer ``[size, row_bytes]``: each token's row once per destination, in
    rank order (the empty row where a low-latency block has no token), its ids kept only where
    they are the destination's experts."""
    t, world = tokens.inv_perm.shape
    entry = _invert(tokens.masked_row if low_latency else tokens.inv_perm, size, fill=t * world)
    send = wire_rows.index_select(0, entry // world)  # entry t * world: row T, the empty row
    _, _, ids = fmt.fields(send)
    ids.masked_fill_(ids // local != (entry % world).unsqueeze(1), -1)  # id -1 // local = -1: stays -1
    return send


def _exchange_counts(tokens: MoeRouting, slots: MoeRouting, group) -> _Splits:
    """The normal mode's count exchange: each rank tells each peer how many tokens and slots it
    sends it. Its one device-to-host read."""
    out = torch.stack((tokens.counts, slots.counts), 1).long()
    into = torch.empty_like(out)
    dist.all_to_all_single(into, out, group=group)
    (tokens_out, slots_out), (tokens_in, slots_in) = torch.stack((out.t(), into.t())).tolist()
    return _Splits(tokens_out, tokens_in, slots_out, slots_in)


def _rows(splits: list[int] | None, world: int, block: int | None) -> int:
    """Rows of one side of an all-to-all: the sum of its splits, or ``world`` equal blocks."""
    return world * block if splits is None else sum(splits)


def _peer_rows(splits: list[int] | None, rank: int, world: int, block: int | None) -> int:
    """Rows of one side of an all-to-all that go to (or come from) other ranks: a rank's rows to
    itself are a local copy, not on the wire."""
    return _rows(splits, world, block) - (block if splits is None else splits[rank])


def _all_to_all(send: torch.Tensor, rows: int, send_splits: list[int] | None, recv_splits: list[int] | None,
                group) -> torch.Tensor:  # fmt: skip
    """Rows ``[n, ...]`` of any dtype exchanged as bytes (gloo has no float8 or bfloat16 in every
    collective); equal blocks without splits."""
    data = send.view(torch.uint8)
    recv = data.new_empty((rows, *data.shape[1:]))
    dist.all_to_all_single(recv, data, recv_splits, send_splits, group=group)
    return recv.view(send.dtype)


def _scatter_rows(src: torch.Tensor, slot_rows: torch.Tensor, size: int, *, zeroed: bool) -> torch.Tensor:
    """``[size, D]`` with row ``slot_rows[i, j]`` = ``src[i]`` for every placed slot (>= 0; rows
    are distinct), the other rows zero (``zeroed``) or not written. Dropped slots go to an extra
    last row, cut off: nothing is read back to the host."""
    alloc = torch.zeros if zeroed else torch.empty
    out = alloc((size + 1, src.shape[1]), dtype=src.dtype, device=src.device)
    out[torch.where(slot_rows >= 0, slot_rows, size).long()] = src.unsqueeze(1).expand(-1, slot_rows.shape[1], -1)
    return out[:size]


def _land(fmt: WireFormat, recv: torch.Tensor, routing: MoeRouting, layout: str, align: int):
    """The received rows in the local layout: ``(q, scale)`` as :func:`fp8quant.moe_dispatch_quant`
    writes them for these tokens (padding rows: zero scales; q zero on the CPU, as the reference
    writes it, and not written on the GPU, as the kernel leaves it)."""
    data, scale, _ = fmt.fields(recv)
    if fmt.wire == "bf16":
        return moe_dispatch_quant(data.view(torch.bfloat16), routing, layout=layout, max_m=routing.max_m, align=align)
    masked = layout == "masked"
    rows = (routing.counts.numel(), routing.max_m) if masked else (routing.m_indices.numel(),)
    slot_rows = routing.masked_row if masked else routing.inv_perm
    size = math.prod(rows)
    q = _scatter_rows(data, slot_rows, size, zeroed=not recv.is_cuda).view(_FP8)
    s = _scatter_rows(scale, slot_rows, size, zeroed=True)
    return q.view(*rows, fmt.hidden), convert_scales(s.view(*rows, scale.shape[1]), "row", "mn_tma")


def _local_routing(ids: torch.Tensor, slots: int, local: int, rank: int, layout: str, align: int) -> MoeRouting:
    """The routing of the received tokens ``ids [n, k]`` to this rank's experts, with static bounds
    (nothing read back): ``slots`` rows (the slots received, or their bound) and each expert's
    padding (contiguous), or as many rows per expert as tokens received, rounded up to whole tiles
    of ``align`` rows (masked: no tile reaches the next expert's rows)."""
    max_m_sum = moe_bounds(slots, 1, local, align=align).max_m_sum
    max_m = align_up(max(ids.shape[0], 1), align) if layout == "masked" else None
    return moe_routing(
        ids.contiguous(), local, expert_offset=rank * local, align=align, max_m_sum=max_m_sum, max_m=max_m
    )


def _return_positions(kept: torch.Tensor, blocks: int) -> torch.Tensor:
    """int64 ``[n, k]``: the row of each kept slot of the received tokens among the rows sent back,
    -1 for the others: kept slots in flat order, packed within each of ``blocks`` equal blocks of
    the received rows (one block per source rank; the normal mode's single block holds them all,
    source by source)."""
    per_block = kept.reshape(blocks, -1)
    start = torch.arange(blocks, device=kept.device).unsqueeze(1) * per_block.shape[1]
    return torch.where(per_block, per_block.cumsum(1) - 1 + start, -1).view(kept.shape)


def ep_dispatch(
    x: torch.Tensor,
    topk_ids: torch.Tensor,
    num_experts: int,
    *,
    group=None,
    mode: str = "normal",
    layout: str = "contiguous",
    max_tokens_per_rank: int | None = None,
    align: int = ALIGN,
    wire: str = "fp8",
) -> EpDispatch:
    """Send each token to the ranks holding its experts and lay the tokens every rank sent here out
    for this rank's grouped GEMMs (module docstring).

    Args:
        x: this rank's tokens, ``[T, H]`` bfloat16 (float16 and float32 with ``wire="fp8"``), H a
            multiple of 128.
        topk_ids: int32 or int64 ``[T, k]``, global expert ids; -1 (or any id outside
            ``0 .. num_experts - 1``) drops a slot.
        num_experts: experts over all ranks, a multiple of the group's size.
        group: the process group (default: the default group).
        mode: ``"normal"`` or ``"low_latency"`` (with ``max_tokens_per_rank``).
        layout: ``"contiguous"`` or ``"masked"``: the local layout (:func:`fp8quant.moe_dispatch_quant`).
        max_tokens_per_rank: the low-latency bound on every rank's T.
        align: rows of each local expert's segment (contiguous) or tile (masked).
        wire: ``"fp8"`` (quantize here, send FP8 and scales) or ``"bf16"`` (send x, quantize there).

    Returns:
        :class:`EpDispatch`: ``q``, ``scale`` and ``routing`` of the received tokens for the local
        experts ``rank * E/world ..``, and the handle for :func:`ep_combine`.

    Example::

        sent = ep_dispatch(x, topk_ids, 256, mode="low_latency", max_tokens_per_rank=128, layout="masked")
        y = expert_ffn(sent.q, sent.scale, sent.routing, w13_local, w2_local, layout="masked")
        out = ep_combine(y, sent.handle, topk_weights)
    """
    rank, world = _process_group(group)
    _check_dispatch_args(x, topk_ids, num_experts, world, mode, layout, max_tokens_per_rank, align, wire)
    local, k = num_experts // world, topk_ids.shape[1]
    fmt = WireFormat(wire, x.shape[1], k)
    low_latency = mode == "low_latency"
    # Rows each rank sends each peer in the low-latency mode: tokens (dispatch), slots (combine)
    block, slot_block = (max_tokens_per_rank, max_tokens_per_rank * k) if low_latency else (None, None)
    ids = _kept_ids(topk_ids, num_experts)
    slot_ranks = ids // local  # the rank holding each slot's expert; -1 // local = -1: dropped
    tokens = _rank_routing(_token_ranks(slot_ranks, world), world, block)
    slots = _rank_routing(slot_ranks, world, slot_block)
    splits = _Splits() if low_latency else _exchange_counts(tokens, slots, group)

    send = _send_rows(fmt, fmt.pack(x, ids), tokens, low_latency, _rows(splits.tokens_out, world, block), local)
    recv = _all_to_all(send, _rows(splits.tokens_in, world, block), splits.tokens_out, splits.tokens_in, group)
    recv_ids = fmt.fields(recv)[2]
    n_slots = _rows(splits.slots_in, world, slot_block)  # slots received (low latency: their bound)
    routing = _local_routing(recv_ids, n_slots, local, rank, layout, align)
    q, scale = _land(fmt, recv, routing, layout, align)

    # The way back: each kept slot's output row, to its token's rank
    positions = _return_positions(recv_ids >= 0, world if low_latency else 1)
    layout_rows = (routing.masked_row if layout == "masked" else routing.inv_perm).reshape(-1)
    count_bytes = 0 if low_latency else 2 * 8 * (world - 1)  # the count exchange: two int64 a peer
    handle = EpHandle(
        group=group,
        layout_shape=tuple(q.shape[:-1]),
        combine_rows=slots.masked_row if low_latency else slots.inv_perm,
        return_rows=layout_rows[_invert(positions, n_slots, fill=0)].clamp(min=0),  # rows of no slot: any row
        return_splits=splits.slots_in,
        combine_splits=splits.slots_out,
        combine_recv_rows=_rows(splits.slots_out, world, slot_block),
        dispatch_bytes=_peer_rows(splits.tokens_out, rank, world, block) * fmt.row_bytes + count_bytes,
        combine_peer_rows=_peer_rows(splits.slots_in, rank, world, slot_block),
    )
    return EpDispatch(q, scale, routing, handle)


# --- Combine -------------------------------------------------------------------------------------


def ep_combine(y: torch.Tensor, handle: EpHandle, topk_weights: torch.Tensor) -> torch.Tensor:
    """Send each slot's expert output back to its token's rank and weight them there:
    ``out[t] = sum_j topk_weights[t, j] * y_j(t)`` in float32, in slot order, rounded once
    (:func:`fp8quant.moe_combine`), the slots dropped at dispatch contributing nothing.

    Args:
        y: this rank's experts' outputs in the layout :func:`ep_dispatch` returned (bfloat16,
            float16 or float32 ``[rows, H]`` or ``[E_local, max_m, H]``, contiguous).
        handle: ``ep_dispatch(...).handle``.
        topk_weights: ``[T, k]`` router weights of this rank's tokens, floating point on y's device
            (taken as float32).

    Returns:
        ``[T, H]`` of y's dtype, in this rank's token order.

    Every argument is checked before the all-to-all.
    """
    if not isinstance(handle, EpHandle):
        raise TypeError("handle must be ep_dispatch(...).handle (an EpHandle)")
    if not isinstance(y, torch.Tensor) or tuple(y.shape[:-1]) != handle.layout_shape or not y.is_contiguous():
        want = ", ".join(map(str, (*handle.layout_shape, "H")))
        got = tuple(y.shape) if isinstance(y, torch.Tensor) else type(y).__name__
        raise ValueError(f"y must be a contiguous tensor [{want}] (the dispatched layout), got {got}")
    if y.dtype not in INPUT_DTYPES:
        raise TypeError(f"y must be bfloat16, float16 or float32, got {y.dtype}")
    rows = handle.combine_rows
    if y.device != rows.device:
        raise ValueError(
            f"y is on {y.device}, the dispatch's tensors on {rows.device}: all tensors must be on one device"
        )
    if not isinstance(topk_weights, torch.Tensor) or topk_weights.shape != rows.shape:
        raise ValueError(f"topk_weights must be a tensor [T, k] = {tuple(rows.shape)}, the shape of the dispatched ids")
    if not topk_weights.is_floating_point():
        raise TypeError(f"topk_weights must be a floating-point tensor (taken as float32), got {topk_weights.dtype}")
    if topk_weights.device != y.device:
        raise ValueError(
            f"topk_weights is on {topk_weights.device}, y on {y.device}: all tensors must be on one device"
        )
    send = y.reshape(-1, y.shape[-1]).index_select(0, handle.return_rows)
    back = _all_to_all(send, handle.combine_recv_rows, handle.return_splits, handle.combine_splits, handle.group)
    return moe_combine(back, rows, topk_weights.float().contiguous())


# --- The layer -----------------------------------------------------------------------------------


def _layer_backend(backend: str, mode: str, device: torch.device) -> str:
    """The local experts' GEMM backend. ``"auto"``: the reference on the CPU; on a GPU DeepGEMM
    (SM90, when it imports) for the normal mode (prefill sizes), else fp8quant's Triton GEMM
    (faster at decode sizes: BENCHMARKS.md), else the reference."""
    if backend != "auto" and backend not in BACKENDS:
        raise ValueError(f"backend must be 'auto' or one of {BACKENDS}, got {backend!r}")
    if device.type != "cuda":
        if backend not in ("auto", "reference"):
            raise ValueError(f"backend={backend!r} needs CUDA tensors; x is on {device}")
        return "reference"
    if backend != "auto":
        return backend
    if mode == "normal" and torch.cuda.get_device_capability(device)[0] == 9 and _have_deep_gemm():
        return "deep_gemm"
    return "triton" if grouped_gemm.available() else "reference"


def _check_weights(x, w13, w2) -> None:
    """What the layer adds to :func:`ep_dispatch`'s checks: bfloat16 tokens, and weights that fit them."""
    if not isinstance(x, torch.Tensor) or x.dim() != 2 or x.dtype != torch.bfloat16:
        raise TypeError("x must be a bfloat16 tensor [T, H]")
    check_expert_weights(w13, w2, x)


def ep_moe_layer(
    x: torch.Tensor,
    topk_ids: torch.Tensor,
    topk_weights: torch.Tensor,
    w13: ExpertWeights,
    w2: ExpertWeights,
    *,
    group=None,
    mode: str = "auto",
    layout: str = "auto",
    max_tokens_per_rank: int | None = None,
    backend: str = "auto",
    wire: str = "fp8",
) -> torch.Tensor:
    """The routed experts of an MoE layer spread over the ranks of ``group``:
    :func:`ep_dispatch`, :func:`fp8quant.expert_ffn` on this rank's experts,
    :func:`ep_combine`. Equal, bit for bit, to ``fp8quant.moe_layer`` of all experts on all ranks'
    tokens (same backend, tested with the reference).

    Args:
        x: bfloat16 ``[T, H]``; topk_ids ``[T, k]`` (global ids, -1 drops a slot); topk_weights ``[T, k]``.
        w13, w2: :func:`fp8quant.prepare_experts` of this rank's experts: rank r holds global
            experts ``r * E_local .. (r + 1) * E_local - 1``, ``E_local = w13.shape[0]``.
        mode: ``"normal"``, ``"low_latency"``, or ``"auto"``: low latency when
            ``max_tokens_per_rank`` is given (a static bound: no host read, CUDA graphs), else normal.
        layout: ``"contiguous"``, ``"masked"``, or ``"auto"``: masked in the low-latency mode
            (DeepEP's), contiguous in the normal mode.
        backend: ``"auto"``, ``"deep_gemm"``, ``"triton"`` or ``"reference"`` (the local GEMMs).
        wire: ``"fp8"`` or ``"bf16"`` (:func:`ep_dispatch`).

    Returns:
        bfloat16 ``[T, H]``.
    """
    _check_weights(x, w13, w2)
    if mode == "auto":
        mode = "normal" if max_tokens_per_rank is None else "low_latency"
    if layout == "auto":
        layout = "masked" if mode == "low_latency" else "contiguous"
    _, world = _process_group(group)
    local = w13.shape[0]
    _check_dispatch_args(x, topk_ids, local * world, world, mode, layout, max_tokens_per_rank, ALIGN, wire)
    if not isinstance(topk_weights, torch.Tensor) or topk_weights.shape != topk_ids.shape:
        raise ValueError(f"topk_weights must be a tensor of topk_ids' shape {tuple(topk_ids.shape)}")
    backend = _layer_backend(backend, mode, x.device)
    # The GEMMs' tile hint: slots per local expert when every rank has this many tokens
    expected_m = max(1, (max_tokens_per_rank or x.shape[0]) * topk_ids.shape[1] // local)
    align = segment_align(backend, layout, expected_m)
    sent = ep_dispatch(
        x, topk_ids, local * world, group=group, mode=mode, layout=layout, max_tokens_per_rank=max_tokens_per_rank,
        align=align, wire=wire,
    )  # fmt: skip
    y = expert_ffn(
        sent.q, sent.scale, sent.routing, w13, w2, layout=layout, backend=backend, expected_m=expected_m, align=align
    )
    return ep_combine(y, sent.handle, topk_weights)
