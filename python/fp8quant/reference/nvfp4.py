"""Reference of NVFP4 (docs/contract.md, "NVFP4"): groups of 16 along the last dimension, e2m1
elements packed two to a byte, one float8_e4m3fn scale per group, and one float32 global scale
per tensor (or per expert), every division IEEE (the canonical recipe, ``division="ieee"``):

- the global (encode) scale ``S = RN(448 * 6 / amax(x))`` over the tensor's finite elements
  (1 when that amax is 0; capped at the largest float32), unless the caller gives it;
- a group's scale ``s = e4m3(RN(RN(amax_g / 6) * S))``, round to nearest even, saturating;
- its elements ``q = e2m1(RN(x * RN(S / s)))`` (0 when ``s`` is 0), round to nearest even,
  saturating to ±6; element 2i in the low nibble of byte i, element 2i + 1 in the high nibble;
- dequantized ``RN(RN(q * s) / S)``.
"""

from __future__ import annotations

import torch

from .._checks import FP8_DTYPE
from ._core import _finite_amax
from .mx import MX_SCALE_LAYOUTS, check_dequant_args, from_swizzled, to_swizzled

__all__ = [
    "E2M1_VALUES",
    "NVFP4_DIVISIONS",
    "NVFP4_GROUP",
    "e2m1_codes",
    "e2m1_value",
    "nvfp4_dequant",
    "nvfp4_global_scale",
    "nvfp4_quant",
]

#: Elements per NVFP4 group.
NVFP4_GROUP = 16
#: How NVFP4's scales are divided: IEEE throughout (the only recipe implemented; peers' fast
#: reciprocals and torchao's reciprocal multiply are not bit-identical to it).
NVFP4_DIVISIONS = ("ieee",)
#: The e2m1 value of each code 0..7 (code 8 + c is its negative).
E2M1_VALUES = (0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0)
_E2M1_MAX = 6.0
_ENCODE_NUMERATOR = 448.0 * 6.0
_FLT_MAX = torch.finfo(torch.float32).max
# Midpoints between neighbouring codes; a tie goes to the even code, which is the upper one
# at 0.75, 1.75 and 3.5 and the lower one at the others.
_MIDPOINTS = (0.25, 0.75, 1.25, 1.75, 2.5, 3.5, 5.0)
_TIES_UP = (0.75, 1.75, 3.5)
_NAN_CODE = 0x7  # e2m1 has no NaN: NaN becomes +6


def e2m1_codes(y: torch.Tensor) -> torch.Tensor:
    """4-bit e2m1 codes (uint8, one per element) of float32 ``y``: round to nearest even,
    saturating to ±6 (±inf too); the sign bit (8) is y's, zeros included; NaN becomes +6."""
    a = y.double().abs()
    code = torch.zeros_like(a, dtype=torch.uint8)
    for m in _MIDPOINTS:
        code += (a > m).to(torch.uint8)
    for m in _TIES_UP:
        code += (a == m).to(torch.uint8)
    code = torch.where(torch.signbit(y), code | 0x8, code)
    return torch.where(torch.isnan(y), torch.full_like(code, _NAN_CODE), code)


def e2m1_value(code: torch.Tensor) -> torch.Tensor:
    """float32 value of 4-bit e2m1 codes (bit 3 the sign)."""
    table = torch.tensor(E2M1_VALUES, dtype=torch.float32, device=code.device)
    v = table[(code & 0x7).long()]
    return torch.where((code & 0x8) != 0, -v, v)


def nvfp4_global_scale(x: torch.Tensor, *, per_batch: bool = False) -> torch.Tensor:
    """The encode scale ``RN(448 * 6 / amax)`` of ``x`` (float32 ``[]``), or of each batch of a 3-D
    ``x [B, M, K]`` with ``per_batch`` (``[B]``, e.g. one per expert): amax over the finite
    elements; 1 when it is 0 (an empty tensor or batch included); capped at the largest float32::

        s_enc = nvfp4_global_scale(x)                      # []
        s_enc = nvfp4_global_scale(w, per_batch=True)      # [E] of w [E, N, K]
    """
    if not isinstance(x, torch.Tensor):
        raise TypeError(f"x must be a torch.Tensor, got {type(x).__name__}")
    if not isinstance(per_batch, bool):
        raise TypeError(f"per_batch must be a bool, got {type(per_batch).__name__}")
    if per_batch and x.dim() != 3:
        raise ValueError(f"per_batch=True gives one scale per batch of a 3-D x [B, M, K], got shape {tuple(x.shape)}")
    if x.numel() == 0:  # amax of nothing: 0, as for an all-zero tensor (amax cannot reduce an empty tensor)
        amax = torch.zeros(x.shape[:1] if per_batch else (), dtype=torch.float64, device=x.device)
    else:
        # In x's own dtype (the amax is exact there): no float32 copy of the tensor
        dims = tuple(range(1, x.dim())) if per_batch else tuple(range(x.dim()))
        amax = _finite_amax(x, dims, 0.0).double()
    scale = (_ENCODE_NUMERATOR / amax).clamp(max=_FLT_MAX).float()
    return torch.where(amax == 0, torch.ones_like(scale), scale)


def nvfp4_quant(
    x: torch.Tensor,
    global_scale: torch.Tensor | None = None,
    *,
    scale_layout: str = "swizzled",
    division: str = "ieee",
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """NVFP4 quantization of ``x [..., M, K]`` (bf16, fp16 or fp32; K a multiple of 16): returns
    ``(q, scale, global_scale)``, ``q`` uint8 ``[..., M, K / 2]`` (two e2m1 codes a byte, element
    2i low), ``scale`` float8_e4m3fn ``[..., M, K / 16]`` (``"row"``) or its swizzled buffer
    ``[..., round_up(M, 128), round_up(K / 16, 4)]`` (``"swizzled"``), and the float32 encode
    scale used. ``global_scale``: float32 ``[]`` for the whole tensor, or ``[B]`` for a 3-D ``x``
    (per expert); by default :func:`nvfp4_global_scale` of x."""
    if x.dim() < 2 or x.shape[-1] % NVFP4_GROUP:
        raise ValueError(f"x must be [..., M, K] with K a multiple of {NVFP4_GROUP}, got {tuple(x.shape)}")
    if scale_layout not in MX_SCALE_LAYOUTS:
        raise ValueError(f"scale_layout must be one of {MX_SCALE_LAYOUTS}, got {scale_layout!r}")
    if division not in NVFP4_DIVISIONS:
        raise ValueError(f"division must be one of {NVFP4_DIVISIONS}, got {division!r}")
    if global_scale is None:
        global_scale = nvfp4_global_scale(x)
    g = global_scale.float()
    if g.dim() not in (0, 1) or (g.dim() == 1 and (x.dim() != 3 or g.shape[0] != x.shape[0])):
        raise ValueError(f"global_scale must be float32 [] or, for x [B, M, K], [B]; got {tuple(g.shape)}")
    q, scale = _quantize_rows(x, g.view(*g.shape, *([1] * (x.dim() - 1 - g.dim()))), scale_layout)
    return q, scale, g


def _quantize_rows(x: torch.Tensor, row_scale: torch.Tensor, scale_layout: str) -> tuple[torch.Tensor, torch.Tensor]:
    """NVFP4 ``(q, scale)`` of ``x [..., M, K]``, each row with the encode scale of ``row_scale``
    (float32, broadcastable to ``[..., M]``)."""
    g64 = row_scale.double().view(*row_scale.shape, 1, 1)  # broadcast over [.., M, groups, 16]
    xf = x.float().unflatten(-1, (-1, NVFP4_GROUP))
    amax = _finite_amax(xf, -1, 0.0).unsqueeze(-1)
    s32 = ((amax.double() / _E2M1_MAX).float().double() * g64).float()  # RN(RN(amax / 6) * S)
    s = s32.clamp(max=448.0).to(FP8_DTYPE)
    sf = s.float().double()
    factor = torch.where(sf == 0, torch.zeros_like(sf), (g64 / sf).clamp(max=_FLT_MAX).float().double())
    codes = e2m1_codes((xf.double() * factor).float()).flatten(-2)
    q = codes[..., 0::2] | (codes[..., 1::2] << 4)
    scale = s.squeeze(-1)
    if scale_layout == "swizzled":
        scale = to_swizzled(scale.view(torch.uint8)).view(FP8_DTYPE)
    return q, scale


def nvfp4_dequant(
    q: torch.Tensor, scale: torch.Tensor, global_scale: torch.Tensor, *, scale_layout: str = "swizzled"
) -> torch.Tensor:
    """float32 ``RN(RN(value * s) / S)`` of NVFP4 ``q [..., M, K / 2]`` (uint8), its ``scale``
    (float8_e4m3fn) in ``scale_layout`` and its float32 encode scale ``global_scale`` (``[]``, or
    ``[B]`` for a 3-D q), as :func:`nvfp4_quant` returns them::

        x_back = nvfp4_dequant(*nvfp4_quant(x))
    """
    rows, cols = check_dequant_args(q, scale, scale_layout, torch.uint8, FP8_DTYPE, NVFP4_GROUP, 2)
    if not isinstance(global_scale, torch.Tensor) or global_scale.dtype != torch.float32:
        got = global_scale.dtype if isinstance(global_scale, torch.Tensor) else type(global_scale).__name__
        raise TypeError(f"global_scale must be a float32 tensor, got {got}")
    shapes = ((), (q.shape[0],)) if q.dim() == 3 else ((),)
    if tuple(global_scale.shape) not in shapes:
        want = " or ".join(str(list(shape)) for shape in shapes)
        raise ValueError(
            f"global_scale must have shape {want} for q of shape {tuple(q.shape)}, got {list(global_scale.shape)}"
        )
    if global_scale.device != q.device:
        raise ValueError(
            f"global_scale is on {global_scale.device}, q on {q.device}: all tensors must be on one device"
        )
    s = scale
    if scale_layout == "swizzled":
        s = from_swizzled(scale.view(torch.uint8), rows, cols).view(FP8_DTYPE)
    codes = torch.stack((q & 0xF, q >> 4), dim=-1).flatten(-2)
    values = e2m1_value(codes).unflatten(-1, (cols, NVFP4_GROUP))
    g = global_scale.double().view(*global_scale.shape, *([1] * (q.dim() - global_scale.dim() + 1)))
    scaled = (values.double() * s.float().double().unsqueeze(-1)).float().double()
    return (scaled / g).float().flatten(-2)
