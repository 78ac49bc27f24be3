"""per_token_group_quant: the public op, its torch.library registration and its CUDA launch."""

from __future__ import annotations

import importlib

import torch

from . import reference
from ._checks import FP8_DTYPE, check_quant_args, resolve_ue8m0
from .layouts import ScaleSpec, scale_spec

try:
    _C = importlib.import_module(f"{__package__}._C")
except ImportError as exc:  # the package still serves the reference on CPU
    _C = None
    _C_IMPORT_ERROR: ImportError | None = exc
else:
    _C_IMPORT_ERROR = None

__all__ = ["per_token_group_quant"]

_LAYOUT_CODES = {"row": 0, "mn": 1, "mn_tma": 2, "packed_ue8m0": 3}
# Layouts whose buffer holds rows past the [M, *] view (align(M, 4)).
_PADDED_LAYOUTS = ("mn_tma", "packed_ue8m0")


def _spec(x: torch.Tensor, group_size: int, scale_layout: str) -> ScaleSpec:
    return scale_spec(scale_layout, x.shape[-2], x.shape[-1] // group_size, tuple(x.shape[:-2]))


def _empty_outputs(x: torch.Tensor, group_size: int, scale_layout: str) -> tuple[torch.Tensor, torch.Tensor]:
    spec = _spec(x, group_size, scale_layout)
    q = torch.empty(x.shape, dtype=FP8_DTYPE, device=x.device)
    scale = torch.empty(spec.numel, dtype=spec.dtype, device=x.device).as_strided(spec.shape, spec.stride)
    return q, scale


def _extension():
    if _C is None:
        raise RuntimeError(
            "fp8quant's CUDA extension (fp8quant._C) could not be imported, so CUDA tensors cannot "
            f"be quantized: {_C_IMPORT_ERROR}"
        )
    return _C


def _run(
    x: torch.Tensor,
    q: torch.Tensor,
    scale: torch.Tensor,
    group_size: int,
    scale_layout: str,
    ue8m0: bool,
    eps: float,
) -> None:
    """Quantize ``x`` into ``q`` and ``scale`` (already validated) on x's device."""
    if x.device.type == "cpu":
        ref_q, ref_scale = reference.per_token_group_quant(
            x, group_size, scale_layout=scale_layout, ue8m0=ue8m0, eps=eps
        )
        q.copy_(ref_q)
        numel = _spec(x, group_size, scale_layout).numel
        scale.as_strided((numel,), (1,)).copy_(ref_scale.as_strided((numel,), (1,)))
        return
    if x.numel() == 0:
        return  # M == 0 or B == 0: empty outputs, nothing to launch
    ext = _extension()
    device = x.device.index
    args = (x.detach(), q.view(torch.uint8), scale, _LAYOUT_CODES[scale_layout], ue8m0, group_size, eps)
    if device == torch.cuda.current_device():
        ext.per_token_group_quant(*args, torch.cuda.current_stream(device).cuda_stream)
    else:
        with torch.cuda.device(device):
            ext.per_token_group_quant(*args, torch.cuda.current_stream(device).cuda_stream)


@torch.library.custom_op("fp8quant::per_token_group_quant", mutates_args=())
def _per_token_group_quant(
    x: torch.Tensor, group_size: int, scale_layout: str, ue8m0: bool, eps: float
) -> tuple[torch.Tensor, torch.Tensor]:
    q, scale = _empty_outputs(x, group_size, scale_layout)
    _run(x, q, scale, group_size, scale_layout, ue8m0, eps)
    return q, scale


@_per_token_group_quant.register_fake
def _(x, group_size, scale_layout, ue8m0, eps):
    # The real strides (with the TMA padding) so torch.compile never assumes contiguous scales.
    return _empty_outputs(x, group_size, scale_layout)


@torch.library.custom_op("fp8quant::per_token_group_quant_out", mutates_args=("q", "scale"))
def _per_token_group_quant_out(
    x: torch.Tensor,
    q: torch.Tensor,
    scale: torch.Tensor,
    group_size: int,
    scale_layout: str,
    ue8m0: bool,
    eps: float,
) -> None:
    spec = _spec(x, group_size, scale_layout)
    if _holds_layout(scale, spec):
        _run(x, q, scale, group_size, scale_layout, ue8m0, eps)
        return
    # A copy without the padding rows (torch.compile clones mutated arguments compactly):
    # quantize into a whole buffer and hand back the visible scales.
    full = torch.empty(spec.numel, dtype=spec.dtype, device=x.device).as_strided(spec.shape, spec.stride)
    _run(x, q, full, group_size, scale_layout, ue8m0, eps)
    scale.copy_(full)


@_per_token_group_quant_out.register_fake
def _(x, q, scale, group_size, scale_layout, ue8m0, eps):
    return None


def _strides_match(scale: torch.Tensor, spec: ScaleSpec) -> bool:
    """Whether ``scale`` has the layout's strides (those of size-1 dimensions do not matter)."""
    return all(size <= 1 or st == want for size, st, want in zip(spec.shape, scale.stride(), spec.stride))


def _storage_bytes_needed(scale: torch.Tensor, spec: ScaleSpec) -> int:
    """Bytes of storage the layout's whole buffer, padding included, needs from scale's start."""
    return (scale.storage_offset() + spec.numel) * scale.element_size()


def _holds_layout(scale: torch.Tensor, spec: ScaleSpec) -> bool:
    """Whether ``scale`` has the layout's strides over a storage that holds its padding too."""
    return _strides_match(scale, spec) and scale.untyped_storage().nbytes() >= _storage_bytes_needed(scale, spec)


def _check_device(name: str, t: torch.Tensor, device: torch.device) -> None:
    if t.device != device:
        raise ValueError(f"{name} is on {t.device}, x on {device}: all tensors must be on one device")


def _byte_span(t: torch.Tensor, numel: int | None = None) -> tuple[int, int]:
    """``[first, past-the-last)`` byte addresses of ``t``'s elements (or of ``numel`` elements
    from its start)."""
    if numel is None:
        numel = 1 + sum((size - 1) * stride for size, stride in zip(t.shape, t.stride())) if t.numel() else 0
    return t.data_ptr(), t.data_ptr() + numel * t.element_size()


def _check_no_overlap(named: list[tuple[str, torch.Tensor, int | None]]) -> None:
    """Refuse outputs that share bytes with the input or with each other."""
    spans = [(name, t.untyped_storage().data_ptr(), _byte_span(t, numel)) for name, t, numel in named]
    for i, (name_a, storage_a, (lo_a, hi_a)) in enumerate(spans):
        for name_b, storage_b, (lo_b, hi_b) in spans[i + 1 :]:
            if storage_a == storage_b and lo_a < hi_b and lo_b < hi_a:
                raise ValueError(f"{name_b} overlaps {name_a}: outputs must not share memory with x or each other")


def _check_out(x: torch.Tensor, out, spec: ScaleSpec) -> tuple[torch.Tensor, torch.Tensor]:
    if not (isinstance(out, (tuple, list)) and len(out) == 2):
        raise TypeError("out must be a (q, scale) pair of tensors")
    q, scale = out
    for name, t in (("out[0] (q)", q), ("out[1] (scale)", scale)):
        if not isinstance(t, torch.Tensor):
            raise TypeError(f"{name} must be a torch.Tensor, got {type(t).__name__}")
        _check_device(name, t, x.device)
    if q.dtype != FP8_DTYPE:
        raise TypeError(f"out[0] (q) must be {FP8_DTYPE}, got {q.dtype}")
    if q.shape != x.shape:
        raise ValueError(f"out[0] (q) must have x's shape {tuple(x.shape)}, got {tuple(q.shape)}")
    if q.numel() > 0 and q.stride(-1) != 1:
        raise ValueError(f"out[0] (q) must have a contiguous last dimension, got strides {tuple(q.stride())}")
    row_span = (q.shape[-2] - 1) * q.stride(-2) + q.shape[-1]
    if (q.shape[-2] > 1 and q.stride(-2) < q.shape[-1]) or (q.dim() == 3 and q.shape[0] > 1 and q.stride(0) < row_span):
        raise ValueError(f"out[0] (q) must not overlap itself, got strides {tuple(q.stride())}")
    if scale.dtype != spec.dtype:
        raise TypeError(f"out[1] (scale) must be {spec.dtype} for scale_layout={spec.layout!r}, got {scale.dtype}")
    if tuple(scale.shape) != spec.shape:
        raise ValueError(f"out[1] (scale) must have shape {spec.shape} for scale_layout={spec.layout!r}, got {tuple(scale.shape)}")
    if not _strides_match(scale, spec):
        raise ValueError(
            f"out[1] (scale) must have strides {spec.stride} for scale_layout={spec.layout!r}, "
            f"got {tuple(scale.stride())}"
        )
    if torch.compiler.is_compiling():
        return q, scale  # storage sizes are not traceable; as_strided on the buffer checks them
    need = _storage_bytes_needed(scale, spec)
    have = scale.untyped_storage().nbytes()
    if spec.numel > 0 and have < need:
        raise ValueError(
            f"out[1] (scale) needs {need} bytes of storage from its start (padding rows included), "
            f"its storage holds {have}; allocate it with fp8quant.empty_scale()"
        )
    _check_no_overlap([("x", x, None), ("out[0] (q)", q, None), ("out[1] (scale)", scale, spec.numel)])
    return q, scale


def per_token_group_quant(
    x: torch.Tensor,
    group_size: int = 128,
    *,
    scale_layout: str = "row",
    ue8m0: bool | None = None,
    eps: float = 1e-10,
    out: tuple[torch.Tensor, torch.Tensor] | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Quantize ``x`` to float8_e4m3fn in groups of ``group_size`` along the last dimension.

    Args:
        x: ``[M, K]`` or ``[B, M, K]`` bfloat16, float16 or float32, last dimension contiguous.
            CUDA tensors run the fused kernel (sm_90 or sm_100); CPU tensors run the reference.
        group_size: 32, 64 or 128; must divide K.
        scale_layout: ``"row"`` (fp32 ``[M, G]`` K-major), ``"mn"`` (fp32 column-major),
            ``"mn_tma"`` (fp32 column-major, rows padded to 4: DeepGEMM SM90 and
            ``torch._scaled_mm``) or ``"packed_ue8m0"`` (int32 ``[M, ceil(G/4)]``, four UE8M0
            bytes a word: DeepGEMM SM100).
        ue8m0: round scales up to powers of two. Defaults to True for ``"packed_ue8m0"`` (which
            requires it) and False otherwise.
        eps: lower bound of each group's amax (DeepGEMM and DeepEP use 1e-4).
        out: optional ``(q, scale)`` to write into, shaped and strided as the op would allocate
            them (see :func:`fp8quant.empty_scale`).

    Returns:
        ``(q, scale)``: q float8_e4m3fn with x's shape; scale in ``scale_layout``.

    Example::

        q, s = fp8quant.per_token_group_quant(x, 128, scale_layout="mn_tma")
        y = torch._scaled_mm(q, w_q.t(), s, w_s.t(), out_dtype=torch.bfloat16)
    """
    ue8m0 = resolve_ue8m0(scale_layout, ue8m0)
    check_quant_args(x, group_size, eps)
    if x.device.type not in ("cpu", "cuda"):
        raise ValueError(f"x must be a CUDA or CPU tensor, got device {x.device}")
    if out is None:
        return torch.ops.fp8quant.per_token_group_quant(x, group_size, scale_layout, ue8m0, float(eps))
    spec = _spec(x, group_size, scale_layout)
    if scale_layout in _PADDED_LAYOUTS and torch.compiler.is_compiling():
        raise ValueError(
            f"out= with scale_layout={scale_layout!r} cannot be compiled: torch.compile clones a mutated "
            "input without the padding rows the kernel writes; call the op without out= in compiled code"
        )
    q, scale = _check_out(x, out, spec)
    torch.ops.fp8quant.per_token_group_quant_out(x, q, scale, group_size, scale_layout, ue8m0, float(eps))
    return q, scale
