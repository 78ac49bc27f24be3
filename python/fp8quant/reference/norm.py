"""References of RMSNorm and RMSNorm + quantization: FP8 groups, MXFP8, NVFP4 (docs/contract.md,
"RMSNorm")."""

from __future__ import annotations

import math

import torch

from .._checks import check_norm_args, check_quant_args
from .mx import mxfp8_quant
from .nvfp4 import nvfp4_quant
from .quant import per_token_group_quant


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
    return _quantized_norm(
        x, weight, eps, residual,
        lambda y: per_token_group_quant(y, group_size, scale_layout=scale_layout, ue8m0=ue8m0, eps=quant_eps),
    )  # fmt: skip


def rms_norm_mxfp8(
    x: torch.Tensor,
    weight: torch.Tensor,
    eps: float = 1e-6,
    *,
    residual: torch.Tensor | None = None,
    recipe: str = "rceil",
    scale_layout: str = "swizzled",
) -> tuple[torch.Tensor, ...]:
    """Reference of :func:`fp8quant.rms_norm_mxfp8`: :func:`mxfp8_quant` of :func:`rms_norm`'s y.
    Returns ``(q, scale)``, or ``(q, scale, h)`` with a residual."""
    return _quantized_norm(x, weight, eps, residual, lambda y: mxfp8_quant(y, recipe=recipe, scale_layout=scale_layout))


def rms_norm_nvfp4(
    x: torch.Tensor,
    weight: torch.Tensor,
    global_scale: torch.Tensor,
    eps: float = 1e-6,
    *,
    residual: torch.Tensor | None = None,
    scale_layout: str = "swizzled",
) -> tuple[torch.Tensor, ...]:
    """Reference of :func:`fp8quant.rms_norm_nvfp4`: :func:`nvfp4_quant` of :func:`rms_norm`'s y
    with the encode scale ``global_scale`` (float32 ``[]``). Returns ``(q, scale)``, or
    ``(q, scale, h)`` with a residual."""
    return _quantized_norm(
        x, weight, eps, residual, lambda y: nvfp4_quant(y, global_scale, scale_layout=scale_layout)[:2]
    )


def _quantized_norm(x, weight, eps, residual, quantize) -> tuple[torch.Tensor, ...]:
    """``quantize`` of :func:`rms_norm`'s y: ``(q, scale)``, or ``(q, scale, h)`` with a residual."""
    out = rms_norm(x, weight, eps, residual=residual)
    q, scale = quantize(out if residual is None else out[0])
    return (q, scale) if residual is None else (q, scale, out[1])
