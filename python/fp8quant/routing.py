"""The routing of an MoE layer's slots to its experts' rows: :class:`MoeRouting`, what
:func:`fp8quant.moe_routing` and :func:`fp8quant.reference.moe_routing` return."""

from __future__ import annotations

from typing import NamedTuple

import torch


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
