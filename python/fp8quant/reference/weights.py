"""References of the weight quantizers (SPEC.md section 3): :func:`fp8quant.per_block_quant` and
:func:`fp8quant.requantize_ue8m0`."""

from __future__ import annotations

import torch

from .._checks import FP8_DTYPE, check_block_quant_args
from ._core import _finite_amax, _quantize, _scale_of, dequantize_blocks


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
