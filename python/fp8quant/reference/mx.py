"""Reference of MXFP8, Blackwell's microscaled FP8 (docs/contract.md, "MXFP8"): groups of 32
along the last dimension, float8_e4m3fn elements, one E8M0 scale byte per group, in row-major
order or in the swizzled layout the block-scaled tensor cores read (cuBLASLt, CUTLASS,
``torch._scaled_mm``).

Scale recipes (the byte ``e`` of the scale ``2^(e - 127)``):

- ``"rceil"`` (the default; NVIDIA's, ``cvt.rp.satfinite.ue8m0x2.f32`` of ``amax / 448``): the
  smallest power of two at or above ``d = RN(amax / 448)``, capped at 254;
- ``"floor"`` (the OCP MX specification's): ``exponent(amax) - exponent(448)``, clamped to
  [0, 254]; it is RCEIL minus one exactly when amax's significand is above 1.75.

amax is taken over the finite elements (as SPEC.md section 1), with no epsilon: an all-zero
group gets byte 0 and zero elements.
"""

from __future__ import annotations

import torch

from ._core import _finite_amax, _quantize

__all__ = [
    "MX_GROUP",
    "MX_RECIPES",
    "e8m0_bytes",
    "from_swizzled",
    "mxfp8_dequant",
    "mxfp8_quant",
    "swizzled_offsets",
    "swizzled_shape",
    "to_swizzled",
]

#: Elements per MXFP8 group.
MX_GROUP = 32
#: E8M0 scale recipes, the default first.
MX_RECIPES = ("rceil", "floor")
#: Scale layouts of the block-scaled formats: row-major [..., M, C], or swizzled for the tensor cores.
MX_SCALE_LAYOUTS = ("row", "swizzled")

_FP8_MAX_EXPONENT = 8  # 448 = 1.75 * 2^8
_MAX_BYTE = 254  # 0xFF is E8M0's NaN
_TWO_POW_MINUS_127_BITS = 0x00400000  # 2^-127, a float32 subnormal: byte 0


def e8m0_bytes(amax: torch.Tensor, recipe: str = "rceil") -> torch.Tensor:
    """The E8M0 scale byte (int32) of each finite, non-negative float32 ``amax`` under ``recipe``."""
    if recipe not in MX_RECIPES:
        raise ValueError(f"recipe must be one of {MX_RECIPES}, got {recipe!r}")
    amax = amax.float()
    if recipe == "floor":
        exponent = (amax.view(torch.int32) >> 23) & 0xFF
        return (exponent - _FP8_MAX_EXPONENT).clamp(0, _MAX_BYTE)
    d = (amax.double() / 448.0).float()  # IEEE division, rounded once
    bits = d.view(torch.int32)
    exponent, mantissa = (bits >> 23) & 0xFF, bits & 0x7FFFFF
    normal = exponent + (mantissa != 0).to(torch.int32)
    subnormal = (bits > _TWO_POW_MINUS_127_BITS).to(torch.int32)  # 0 up to 2^-127, else 2^-126
    return torch.where(exponent == 0, subnormal, normal).clamp(max=_MAX_BYTE)


def _scale_of_byte(e: torch.Tensor) -> torch.Tensor:
    """2^(e - 127) as float32, exactly (byte 0: the subnormal 2^-127)."""
    return torch.where(e == 0, _TWO_POW_MINUS_127_BITS, e << 23).to(torch.int32).view(torch.float32)


def swizzled_shape(rows: int, cols: int) -> tuple[int, int]:
    """The swizzled scale buffer of a ``[rows, cols]`` scale matrix, as a byte matrix:
    ``(round_up(rows, 128), round_up(cols, 4))``."""
    return -(-rows // 128) * 128, -(-cols // 4) * 4


def swizzled_offsets(rows: int, cols: int, device=None) -> torch.Tensor:
    """Byte offset of scale ``(r, c)`` in the swizzled buffer, int64 ``[rows, cols]``:
    ``(r // 128) * ceil(cols / 4) * 512 + (c // 4) * 512 + (r % 32) * 16 + ((r % 128) // 32) * 4
    + c % 4`` (128 x 4 tiles of 512 bytes, row tiles outermost)."""
    r = torch.arange(rows, device=device, dtype=torch.int64).unsqueeze(1)
    c = torch.arange(cols, device=device, dtype=torch.int64).unsqueeze(0)
    tiles_per_row = -(-cols // 4)
    return (r // 128) * tiles_per_row * 512 + (c // 4) * 512 + (r % 32) * 16 + ((r % 128) // 32) * 4 + c % 4


def to_swizzled(scales: torch.Tensor) -> torch.Tensor:
    """Row-major scales ``[*, R, C]`` (one byte each) in the swizzled layout: ``[*, R', C']`` of
    :func:`swizzled_shape`, contiguous, each batch its own buffer; padding bytes are 0."""
    *batch, rows, cols = scales.shape
    padded_rows, padded_cols = swizzled_shape(rows, cols)
    flat = scales.new_zeros((*batch, padded_rows * padded_cols))
    offsets = swizzled_offsets(rows, cols, scales.device).flatten()
    flat[..., offsets] = scales.reshape(*batch, rows * cols)
    return flat.view(*batch, padded_rows, padded_cols)


def from_swizzled(swizzled: torch.Tensor, rows: int, cols: int) -> torch.Tensor:
    """The row-major ``[*, rows, cols]`` scales held by a swizzled buffer (:func:`to_swizzled`)."""
    *batch, _, _ = swizzled.shape
    offsets = swizzled_offsets(rows, cols, swizzled.device).flatten()
    return swizzled.flatten(-2)[..., offsets].view(*batch, rows, cols)  # flatten: -1 is ambiguous for 0 batches


def check_dequant_args(
    q, scale, scale_layout: str, q_dtype: torch.dtype, scale_dtype: torch.dtype, group: int, per_byte: int
) -> tuple[int, int]:
    """The operands of a block-scaled dequantization: ``q [..., M, K / per_byte]`` of ``q_dtype``
    (``per_byte`` values a byte), K a multiple of ``group``, and its ``scale`` of ``scale_dtype``
    with the shape of ``scale_layout`` (one of MX_SCALE_LAYOUTS) on q's device. Returns the scale
    matrix's rows and columns ``(M, K / group)``."""
    if not isinstance(q, torch.Tensor):
        raise TypeError(f"q must be a torch.Tensor, got {type(q).__name__}")
    if q.dtype != q_dtype:
        raise TypeError(f"q must be {q_dtype}, got {q.dtype}")
    k = q.shape[-1] * per_byte if q.dim() else 0
    if q.dim() < 2 or k % group:
        cols = "K" if per_byte == 1 else f"K / {per_byte}"
        raise ValueError(f"q must be [..., M, {cols}] with K a multiple of {group}, got shape {tuple(q.shape)}")
    if scale_layout not in MX_SCALE_LAYOUTS:
        raise ValueError(f"scale_layout must be one of {MX_SCALE_LAYOUTS}, got {scale_layout!r}")
    if not isinstance(scale, torch.Tensor):
        raise TypeError(f"scale must be a torch.Tensor, got {type(scale).__name__}")
    if scale.dtype != scale_dtype:
        raise TypeError(f"scale must be {scale_dtype}, got {scale.dtype}")
    rows, cols = q.shape[-2], k // group
    want = (*q.shape[:-2], *(swizzled_shape(rows, cols) if scale_layout == "swizzled" else (rows, cols)))
    if tuple(scale.shape) != want:
        raise ValueError(
            f"scale must have shape {want} for q of shape {tuple(q.shape)} and scale_layout={scale_layout!r}, "
            f"got {tuple(scale.shape)}"
        )
    if scale.device != q.device:
        raise ValueError(f"scale is on {scale.device}, q on {q.device}: all tensors must be on one device")
    return rows, cols


def mxfp8_quant(
    x: torch.Tensor, *, recipe: str = "rceil", scale_layout: str = "swizzled"
) -> tuple[torch.Tensor, torch.Tensor]:
    """MXFP8 quantization of ``x [..., M, K]`` (bf16, fp16 or fp32; K a multiple of 32): returns
    ``(q, scale)``, ``q`` float8_e4m3fn of x's shape, ``scale`` float8_e8m0fnu: the swizzled buffer
    ``[..., round_up(M, 128), round_up(K / 32, 4)]`` (``scale_layout="swizzled"``, the default: what
    the tensor cores read) or ``[..., M, K / 32]`` (``"row"``). ``q = e4m3(x / 2^(e - 127))``, rounded to nearest even and saturated to
    ±448; NaN stays NaN, ±inf become ±448."""
    if x.dim() < 2 or x.shape[-1] % MX_GROUP:
        raise ValueError(f"x must be [..., M, K] with K a multiple of {MX_GROUP}, got {tuple(x.shape)}")
    if scale_layout not in MX_SCALE_LAYOUTS:
        raise ValueError(f"scale_layout must be one of {MX_SCALE_LAYOUTS}, got {scale_layout!r}")
    xf = x.float().unflatten(-1, (-1, MX_GROUP))
    e = e8m0_bytes(_finite_amax(xf, -1, 0.0), recipe)
    q = _quantize(xf, _scale_of_byte(e).unsqueeze(-1)).flatten(-2)
    scale = e.to(torch.uint8)
    if scale_layout == "swizzled":
        scale = to_swizzled(scale)
    return q, scale.view(torch.float8_e8m0fnu)


def mxfp8_dequant(q: torch.Tensor, scale: torch.Tensor, *, scale_layout: str = "swizzled") -> torch.Tensor:
    """float32 ``q * 2^(e - 127)`` of MXFP8 ``q [..., M, K]`` (float8_e4m3fn) and its ``scale``
    (float8_e8m0fnu) in ``scale_layout``, as :func:`mxfp8_quant` returns them::

        x_back = mxfp8_dequant(*mxfp8_quant(x))
    """
    rows, cols = check_dequant_args(q, scale, scale_layout, torch.float8_e4m3fn, torch.float8_e8m0fnu, MX_GROUP, 1)
    e = scale.view(torch.uint8)
    if scale_layout == "swizzled":
        e = from_swizzled(e, rows, cols)
    s = _scale_of_byte(e.to(torch.int32))
    return (q.float().unflatten(-1, (cols, MX_GROUP)) * s.unsqueeze(-1)).flatten(-2)
