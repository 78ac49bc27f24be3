"""Argument checks shared by the CUDA path and the reference, so both refuse the same input
with the same message."""

from __future__ import annotations

import torch

from .layouts import check_scale_layout

INPUT_DTYPES = (torch.bfloat16, torch.float16, torch.float32)
GROUP_SIZES = (32, 64, 128)
FP8_DTYPE = torch.float8_e4m3fn
# eps is used as a float32: it must stay positive and finite there.
_FP32_TINY = torch.finfo(torch.float32).smallest_normal
FP32_MAX = torch.finfo(torch.float32).max


def resolve_ue8m0(scale_layout: str, ue8m0: bool | None) -> bool:
    """``ue8m0=None`` means "what the layout implies": packed_ue8m0 is UE8M0 by definition."""
    check_scale_layout(scale_layout)
    if ue8m0 is not None and not isinstance(ue8m0, bool):
        raise TypeError(f"ue8m0 must be a bool or None, got {type(ue8m0).__name__}")
    if scale_layout == "packed_ue8m0":
        if ue8m0 is False:
            raise ValueError("ue8m0=False contradicts scale_layout='packed_ue8m0' (packed scales are UE8M0)")
        return True
    return ue8m0 is True


def _check_input(t: torch.Tensor, name: str, shapes: str) -> None:
    """An input of the quantizers: a 2-D or 3-D (``shapes`` names them) tensor of an input dtype."""
    if not isinstance(t, torch.Tensor):
        raise TypeError(f"{name} must be a torch.Tensor, got {type(t).__name__}")
    if t.dtype not in INPUT_DTYPES:
        raise TypeError(f"{name} must be bfloat16, float16 or float32, got {t.dtype}")
    if t.dim() not in (2, 3):
        raise ValueError(f"{name} must be {shapes}, got shape {tuple(t.shape)}")


def _check_last_dim(t: torch.Tensor, name: str) -> None:
    if t.numel() > 0 and t.stride(-1) != 1:
        raise ValueError(f"{name} must have a contiguous last dimension, got strides {tuple(t.stride())}")


def check_quant_args(x: torch.Tensor, group_size: int, eps: float, eps_name: str = "eps") -> None:
    _check_input(x, "x", "2-D [M, K] or 3-D [B, M, K]")
    if isinstance(group_size, bool) or not isinstance(group_size, int):
        raise TypeError(f"group_size must be an int, got {type(group_size).__name__}")
    if group_size not in GROUP_SIZES:
        raise ValueError(f"group_size must be one of {GROUP_SIZES}, got {group_size}")
    k = x.shape[-1]
    if k == 0 or k % group_size != 0:
        raise ValueError(f"x.shape[-1] (K={k}) must be a positive multiple of group_size ({group_size})")
    _check_last_dim(x, "x")
    check_eps(eps, eps_name)


def check_int(value, name: str, minimum: int = 1, *, allow_none: bool = False) -> None:
    """``value`` (the argument ``name``) is an int of at least ``minimum`` (or None, if allowed)."""
    if allow_none and value is None:
        return
    if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
        raise ValueError(f"{name} must be an int >= {minimum}, got {value!r}")


def check_eps(eps: float, name: str = "eps") -> None:
    """eps (the argument ``name``) is a finite float32 of at least the smallest normal float32
    (the C API's rule)."""
    if isinstance(eps, bool) or not isinstance(eps, (int, float)):
        raise TypeError(f"{name} must be a float, got {type(eps).__name__}")
    # Comparisons only (NaN fails both): math.isfinite cannot trace a symbolic float
    if not (_FP32_TINY <= eps <= FP32_MAX):
        raise ValueError(f"{name} must be a positive float32 number (in [{_FP32_TINY}, {FP32_MAX}]), got {eps!r}")


def check_block_quant_args(w: torch.Tensor, block_size, ue8m0: bool, eps: float) -> None:
    _check_input(w, "w", "2-D [N, K] or 3-D [E, N, K]")
    if w.shape[-1] == 0:
        raise ValueError("w.shape[-1] (K) must be positive")
    _check_last_dim(w, "w")
    if not (
        isinstance(block_size, (tuple, list))
        and len(block_size) == 2
        and all(isinstance(b, int) and not isinstance(b, bool) and b > 0 for b in block_size)
    ):
        raise ValueError(f"block_size must be a pair of positive ints (block_n, block_k), got {block_size!r}")
    if not isinstance(ue8m0, bool):
        raise TypeError(f"ue8m0 must be a bool, got {type(ue8m0).__name__}")
    check_eps(eps)
