"""Reference of the activation quantizer (:func:`fp8quant.per_token_group_quant`)."""

from __future__ import annotations

import torch

from .._checks import check_quant_args, resolve_ue8m0
from ..layouts import scale_spec
from ._core import _pack_bytes, _place_scales, quantize_groups


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
