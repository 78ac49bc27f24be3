"""Argument checks shared by the CUDA path and the reference, so both refuse the same input
with the same message; and the kernels' limits (src/api/*.cpp), which the public functions check
before either path, so that a CPU tensor is refused where a CUDA tensor would be, with the C API's
message."""

from __future__ import annotations

import torch

from .layouts import ScaleSpec, check_scale_layout, scale_spec

INPUT_DTYPES = (torch.bfloat16, torch.float16, torch.float32)
GROUP_SIZES = (32, 64, 128)
FP8_DTYPE = torch.float8_e4m3fn
# eps is used as a float32: it must stay positive and finite there.
_FP32_TINY = torch.finfo(torch.float32).smallest_normal
FP32_MAX = torch.finfo(torch.float32).max

# The kernels' limits, as the C API checks them
KERNEL_BLOCK = 128  # per_block_quant / requantize_ue8m0 blocks (src/api/weights.cpp)
MOE_GROUP_SIZE = 128  # silu_mul_quant and moe_dispatch_quant are built for these groups only (src/api/moe.cpp)
NORM_MAX_H = 16384  # the RMSNorm kernels' H: one 16-element slice per thread, 1024 threads (src/api/norm.cpp)


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


def check_block_rows(x: torch.Tensor, group: int, shapes: str) -> None:
    """The input of a block-scaled quantizer (MXFP8, NVFP4): an input dtype, 2-D or 3-D
    (``shapes`` names them), K a positive multiple of ``group``, a contiguous last dimension."""
    _check_input(x, "x", shapes)
    k = x.shape[-1]
    if k == 0 or k % group:
        raise ValueError(f"x.shape[-1] (K={k}) must be a positive multiple of {group}")
    _check_last_dim(x, "x")


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


def check_block_limits(block_size) -> None:
    """``block_size`` (a valid pair) is the kernels' 128 x 128: the C API's rule and message."""
    for name, b in zip(("block_n", "block_k"), block_size):
        if b != KERNEL_BLOCK:
            raise ValueError(f"{name}: must be {KERNEL_BLOCK}, got {b}")


def check_moe_group_size(group_size, op: str) -> None:
    """``group_size`` of the MoE quantizer ``op`` is 128, the only size its kernel is built for (the C API's
    rule and message)."""
    if isinstance(group_size, bool) or not isinstance(group_size, int):
        raise TypeError(f"group_size must be an int, got {type(group_size).__name__}")
    if group_size != MOE_GROUP_SIZE:
        raise ValueError(f"group_size: must be {MOE_GROUP_SIZE} for {op}, got {group_size}")


def check_routing_tokens(x: torch.Tensor, routing) -> None:
    """``x [T, H]`` holds the T tokens ``routing`` was built for (its ``inv_perm`` is ``[T, k]``): more would
    be ignored, fewer read past x. Shapes only: nothing is read from the device."""
    t = routing.inv_perm.shape[0]
    if x.shape[0] != t:
        raise ValueError(
            f"x has {x.shape[0]} tokens but the routing was made for {t} (x and routing must describe the same tokens)"
        )


def check_masked_max_m(routing, max_m: int) -> None:
    """``max_m``, the masked layout's rows per expert, is the routing's own where it recorded one:
    ``masked_row`` encodes a slot's row as ``e * routing.max_m + rank``, so another would misplace rows."""
    if routing.max_m is not None and max_m != routing.max_m:
        raise ValueError(f"max_m={max_m} differs from the routing's max_m={routing.max_m} (masked_row encodes it)")


def check_norm_args(x: torch.Tensor, weight: torch.Tensor, eps: float, residual: torch.Tensor | None,
                    max_h: int | None = None) -> None:  # fmt: skip
    """The RMSNorm arguments (docs/contract.md, "RMSNorm"); with ``max_h``, H is also at most that (the
    kernels' limit, with the C API's message)."""
    if not isinstance(x, torch.Tensor) or x.dim() != 2 or x.dtype not in (torch.bfloat16, torch.float16):
        raise TypeError("x must be a bfloat16 or float16 tensor [M, H]")
    h = x.shape[1]
    if max_h is not None:
        if not (0 < h <= max_h and h % 16 == 0):
            raise ValueError(f"h: must be a positive multiple of 16, at most {max_h}, got {h}")
    elif h % 16 or h == 0:
        raise ValueError(f"H must be a positive multiple of 16, got {h}")
    if not isinstance(weight, torch.Tensor) or weight.dtype != x.dtype or tuple(weight.shape) != (h,):
        raise TypeError(f"weight must be a {x.dtype} tensor [{h}] (x's dtype and H)")
    if isinstance(eps, bool) or not isinstance(eps, (int, float)) or not 0 <= eps <= FP32_MAX:  # NaN fails too
        raise ValueError(f"eps must be a float32 number >= 0 (at most {FP32_MAX}), got {eps!r}")
    if residual is not None and (
        not isinstance(residual, torch.Tensor) or residual.dtype != x.dtype or residual.shape != x.shape
    ):
        raise TypeError(f"residual must be a {x.dtype} tensor of x's shape {tuple(x.shape)}")
    for name, t in (("weight", weight), ("residual", residual)):
        if t is not None and t.device != x.device:
            raise ValueError(f"{name} is on {t.device}, x on {x.device}: all tensors must be on one device")


# --- scale transforms' operands ---------------------------------------------------------------


def check_scale_tensor(
    scale: torch.Tensor, layout: str, dtype: torch.dtype, cols: int | None = None, name: str = "scale"
) -> ScaleSpec:
    """``scale`` (the argument ``name``) has ``dtype`` and the shape and strides of ``layout`` (its
    own column count, or ``cols`` groups for a packed tensor); returns its geometry."""
    if not isinstance(scale, torch.Tensor):
        raise TypeError(f"{name} must be a torch.Tensor, got {type(scale).__name__}")
    if scale.dtype != dtype:
        raise TypeError(f"{name} must be {dtype} for layout {layout!r}, got {scale.dtype}")
    if scale.dim() < 2:
        raise ValueError(f"{name} must be [*, M, G], got shape {tuple(scale.shape)}")
    spec = scale_spec(layout, scale.shape[-2], scale.shape[-1] if cols is None else cols, tuple(scale.shape[:-2]))
    if tuple(scale.shape) != spec.shape or any(
        n > 1 and st != want for n, st, want in zip(spec.shape, scale.stride(), spec.stride)
    ):
        raise ValueError(
            f"{name} must have shape {spec.shape} and strides {spec.stride} for layout {layout!r}, "
            f"got {tuple(scale.shape)} and {tuple(scale.stride())}"
        )
    return spec


def check_packed_tensor(packed: torch.Tensor, num_groups: int) -> None:
    """``packed`` is packed_ue8m0 words ``[*, M, ceil(num_groups / 4)]`` with that layout's strides."""
    if isinstance(num_groups, bool) or not isinstance(num_groups, int) or num_groups < 1:
        raise ValueError(f"num_groups must be an int >= 1, got {num_groups!r}")
    if isinstance(packed, torch.Tensor) and packed.dim() >= 2 and packed.shape[-1] != -(-num_groups // 4):
        raise ValueError(f"packed has {packed.shape[-1]} words a row; {num_groups} groups need {-(-num_groups // 4)}")
    check_scale_tensor(packed, "packed_ue8m0", torch.int32, cols=num_groups, name="packed")


def check_weight_scale_args(w_scale: torch.Tensor, n: int, block_n: int) -> None:
    """``w_scale`` is contiguous float32 ``[*, ceil(n / block_n), kb]`` with kb >= 1."""
    if not isinstance(w_scale, torch.Tensor) or w_scale.dtype != torch.float32 or w_scale.dim() < 2:
        raise TypeError("w_scale must be a float32 tensor [*, ceil(N / block_n), ceil(K / block_k)]")
    if w_scale.shape[-1] < 1 or not w_scale.is_contiguous():
        raise ValueError(f"w_scale must be contiguous with at least one column, got shape {tuple(w_scale.shape)} "
                         f"and strides {tuple(w_scale.stride())}")  # fmt: skip
    if isinstance(block_n, bool) or not isinstance(block_n, int) or block_n < 1:
        raise ValueError(f"block_n must be a positive int, got {block_n!r}")
    if isinstance(n, bool) or not isinstance(n, int) or n < 0 or -(-n // block_n) != w_scale.shape[-2]:
        raise ValueError(f"n must be an int with ceil(n / block_n) == {w_scale.shape[-2]}, got {n!r}")
