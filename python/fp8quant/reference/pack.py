"""References of the scale transforms (docs/contract.md, "Scale transforms"): fp32 layouts,
UE8M0 packing and unpacking, and the SM100 weight-scale form."""

from __future__ import annotations

import torch

from .._checks import check_packed_tensor, check_scale_tensor, check_weight_scale_args
from ..layouts import scale_spec
from ._core import _pack_bytes, _place_scales

_FP32_LAYOUTS = ("row", "mn", "mn_tma")


_UE8M0_SUBNORMAL = 0x00400000  # 2^-127, UE8M0 byte 0, a float32 subnormal


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


def sm100_weight_scales(w_scale: torch.Tensor, n: int, block_n: int = 128) -> torch.Tensor:
    """DeepGEMM SM100's form of power-of-two per-block weight scales ``[*, ceil(N/bn), kb]``
    (contiguous fp32, as per_block_quant writes them): row n takes the scales of block
    ``n // block_n``, packed like activation scales: int32 ``[*, N, ceil(kb/4)]``, strides
    ``(1, align(N, 4))`` (SPEC 3)."""
    check_weight_scale_args(w_scale, n, block_n)
    _ue8m0_bytes(w_scale, "w_scale")  # a bad scale is named by its place in w_scale, not in the broadcast rows
    rows = w_scale.repeat_interleave(block_n, dim=-2)[..., :n, :].contiguous()  # [*, N, kb], row layout
    return pack_ue8m0(rows, "row")
