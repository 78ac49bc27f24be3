"""Pure-PyTorch reference of every fp8quant op: the oracle the CUDA kernels are tested against,
and the implementation used for CPU tensors.

It follows SPEC.md literally and favours exactness over speed: divisions are done in float64
and rounded once to float32, which equals IEEE float32 division for every input (a float64
quotient of two float32 numbers is never a double-rounding hazard: 53 >= 2*24 + 2).
"""

from __future__ import annotations

import torch

from ._checks import FP8_DTYPE, check_block_quant_args, check_quant_args, resolve_ue8m0
from .layouts import ScaleSpec, scale_spec

__all__ = ["FP8_MAX", "per_block_quant", "per_token_group_quant", "quantize_groups", "ue8m0_round_up"]

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

    # Pack four UE8M0 bytes per int32, little-endian; bytes of groups past G are 0
    byte = torch.zeros((*scale.shape[:-1], 4 * spec.cols), dtype=torch.uint8, device=x.device)
    byte[..., : scale.shape[-1]] = e.to(torch.uint8)
    shifts = torch.tensor([0, 8, 16, 24], dtype=torch.int64, device=x.device)
    packed = (byte.unflatten(-1, (spec.cols, 4)).to(torch.int64) << shifts).sum(-1)
    packed = torch.where(packed >= 2**31, packed - 2**32, packed).to(torch.int32)
    return q.contiguous(), _place_scales(packed, spec)


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
