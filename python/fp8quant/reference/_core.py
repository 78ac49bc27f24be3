"""The quantization core every reference shares (SPEC.md section 1): group amax, the IEEE
float32 scale and its UE8M0 rounding, round-to-nearest-even to float8_e4m3fn, the scales placed
in their layout, UE8M0 bytes packed four to a word, and dequantization."""

from __future__ import annotations

import torch

from .._checks import FP8_DTYPE
from ..layouts import ScaleSpec

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
    amax = xf.abs().nan_to_num_(nan=0.0, posinf=0.0).amax(dims)  # NaN and inf as 0; exact in any dtype
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


def _pack_bytes(e: torch.Tensor, words: int) -> torch.Tensor:
    """UE8M0 bytes ``e [..., G]`` (int32) four to an int32 word, little-endian (byte j of word p is
    group 4p + j): ``[..., words]``; the bytes of groups past G are 0."""
    byte = torch.zeros((*e.shape[:-1], 4 * words), dtype=torch.uint8, device=e.device)
    byte[..., : e.shape[-1]] = e.to(torch.uint8)
    shifts = torch.tensor([0, 8, 16, 24], dtype=torch.int64, device=e.device)
    packed = (byte.unflatten(-1, (words, 4)).to(torch.int64) << shifts).sum(-1)
    return torch.where(packed >= 2**31, packed - 2**32, packed).to(torch.int32)


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
