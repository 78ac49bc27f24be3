"""Block-scaled FP8 linear layers on the recipes of :mod:`fp8quant.recipes`: activations and
weights quantized in the format a backend reads, and ``y = x @ w.T`` through DeepGEMM,
``torch._scaled_mm`` or the reference.

    w = fp8quant.prepare_weight(weight)   # bf16 [N, K], or a checkpoint's (fp8 weight, weight_scale_inv)
    y = fp8quant.linear(x, w)             # x bf16 [..., K] -> y bf16 [..., N]

``backend="auto"`` picks the recipe (:func:`select_backend`); the choice travels with the weight
(``QuantizedWeight.recipe``) and every operand carries its format, so an operand in another
format (another layout, or UE8M0 where the GEMM reads fp32 scales) raises
:class:`FormatMismatchError` instead of computing garbage.

Backends :func:`linear` runs:

- ``"scaled_mm"`` (SM90): ``torch._scaled_mm`` with 1 x 128 activation scales of strides exactly
  ``(1, M)`` and ``scale_b = w_scale.t()``. cuBLASLt needs M % 4 == 0, so M is padded to a
  multiple of 4 (zero rows, sliced off the product). For K with ``ceil(K/128) % 4 != 0``
  ``torch._scaled_mm`` refuses the padded weight scales and misreads unpadded ones
  (docs/backends.md), so those K go through ``torch.nn.functional.scaled_mm`` with the padded
  buffer. Under torch.compile both are one opaque op (``fp8quant::scaled_mm_blockwise``). CUDA
  only: CPU operands take the reference path.
- ``"deep_gemm"`` (SM90 and SM100): ``deep_gemm.fp8_gemm_nt`` (DeepGEMM 2.6.1's signature; the
  GPU suite compares the product with a direct ``fp8_gemm_nt`` call, docs/backends.md); the CPU
  tests check the call with a stand-in that follows 2.6.1's signature and assertions. On SM90 the output is bfloat16 only (DeepGEMM's 1D2D kernel asserts it, so
  ``out_dtype=torch.float32`` is refused here); SM100's 1D1D kernel writes bfloat16 or float32.
  ``backend="auto"`` takes DeepGEMM when ``import deep_gemm`` succeeds (tried once per process).
  Calls go to the installed package as they are, so ``torch.compile`` breaks the graph there.
- ``"reference"``: dequantize and multiply in float32, on any device.

The ``"scaled_mm"`` and reference paths make no host synchronization and no allocation whose
size depends on values: they run under ``torch.compile(fullgraph=True)`` and in CUDA graphs.
"""

from __future__ import annotations

import functools
import importlib
import warnings
from types import ModuleType
from typing import NamedTuple

import torch

from . import pack, reference
from ._checks import FP8_DTYPE, INPUT_DTYPES
from ._ops import tracing
from .layouts import align, empty_scale, scale_spec
from .quant import per_token_group_quant
from .recipes import BACKENDS, ActivationFormat, Recipe, WeightFormat, recipe
from .weights import per_block_quant

__all__ = [
    "FormatMismatchError",
    "QuantizedActivation",
    "QuantizedWeight",
    "calc_diff",
    "linear",
    "prepare_weight",
    "quantize_activation",
    "select_backend",
]

# Rows torch._scaled_mm (cuBLASLt) needs M padded to; the scaled_mm recipe's m_align
_SCALED_MM_ROWS = 4
_OUT_DTYPES = (torch.bfloat16, torch.float16, torch.float32)
_DEEP_GEMM_OUT_DTYPES = (torch.bfloat16, torch.float32)  # fp8_gemm_nt's D (SM90: bfloat16 only)


class QuantizedActivation(NamedTuple):
    """Activations ``[M, K]`` quantized for a GEMM (:func:`quantize_activation`): ``q``
    float8_e4m3fn, ``scale`` in ``format``'s layout."""

    q: torch.Tensor
    scale: torch.Tensor
    format: ActivationFormat


class QuantizedWeight(NamedTuple):
    """A weight ``[N, K]`` prepared for one backend (:func:`prepare_weight`): ``q`` float8_e4m3fn
    ``[N, K]`` contiguous, ``scale`` in ``format``'s form, and the ``recipe`` (backend and
    architecture) it was prepared for, which :func:`linear` follows."""

    q: torch.Tensor
    scale: torch.Tensor
    format: WeightFormat
    recipe: Recipe


class FormatMismatchError(ValueError):
    """An operand whose scale format is not the one its GEMM's recipe reads."""


# --------------------------------------------------------------------------------------------
# Choosing a recipe
# --------------------------------------------------------------------------------------------


@functools.cache
def _import_deep_gemm() -> tuple[ModuleType | None, Exception | None]:
    """``import deep_gemm``, tried once per process: ``(module, None)``, or ``(None, the error)``.
    Any exception counts as a failed import (DeepGEMM's ``__init__`` also asserts a CUDA home and
    initializes its C++ runtime)."""
    try:
        return importlib.import_module("deep_gemm"), None
    except Exception as error:
        return None, error


def _not_installed(error: Exception) -> bool:
    """The import failed because there is no ``deep_gemm`` package at all (nothing to warn about)."""
    return isinstance(error, ModuleNotFoundError) and error.name == "deep_gemm"


@functools.cache
def _have_deep_gemm() -> bool:
    """Whether ``import deep_gemm`` succeeds (decided once per process): ``backend="auto"``'s test.
    A package that is there but fails to import gives one warning naming the error; ``"auto"``
    then picks another backend."""
    module, error = _import_deep_gemm()
    if module is None and not _not_installed(error):
        warnings.warn(
            f"deep_gemm is installed but does not import ({type(error).__name__}: {error}); "
            "backend='auto' picks another backend",
            stacklevel=2,
        )
    return module is not None


def _have_scaled_mm_v2() -> bool:
    """Whether torch has ``torch.nn.functional.scaled_mm`` (explicit scaling recipes)."""
    return hasattr(torch.nn.functional, "scaled_mm") and hasattr(torch.nn.functional, "ScalingType")


def _device_arch(device: torch.device) -> int | None:
    """The compute capability's major number of a CUDA device; None for any other device."""
    if device.type != "cuda":
        return None
    return torch.cuda.get_device_capability(device)[0]


def _check_arch(arch) -> None:
    if arch is not None and (isinstance(arch, bool) or not isinstance(arch, int)):
        raise TypeError(f"arch must be an int (the compute capability's major number) or None, got {arch!r}")


def _fits(r: Recipe, n: int | None, k: int | None) -> bool:
    """N and K (None: unknown) meet the recipe's alignments."""
    return (n is None or n % r.n_align == 0) and (k is None or k % r.k_align == 0)


def _auto(n: int | None, k: int | None, device: torch.device, arch: int | None) -> Recipe:
    if arch is None:
        arch = _device_arch(device)
        if arch is None:  # the CPU: only the reference runs there
            return recipe("reference", 0)
    if arch in (9, 10) and _have_deep_gemm():
        r = recipe("deep_gemm", arch)
        if _fits(r, n, k):
            return r
    if arch == 9:
        r = recipe("scaled_mm", 9)
        kb_ok = k is None or -(-k // 128) % 4 == 0 or _have_scaled_mm_v2()
        if _fits(r, n, k) and kb_ok:
            return r
    return recipe("reference", 0)


def select_backend(n: int, k: int, device: torch.device | str | None = None, *, arch: int | None = None) -> Recipe:
    """The recipe ``backend="auto"`` picks for a weight ``[n, k]`` on ``device``.

    DeepGEMM when ``import deep_gemm`` succeeds (tried once per process; an installed package that
    fails to import warns once), the device is SM90 or SM100 and ``n % 64 == 0`` and
    ``k % 128 == 0`` (vLLM's rule); else ``torch._scaled_mm`` on SM90 (N and K multiples of 16);
    else the reference. ``device`` defaults to the current CUDA device, or the CPU without one;
    a CPU device picks the reference unless ``arch`` names an architecture to plan for. The
    choice is visible here and, after :func:`prepare_weight`, in ``QuantizedWeight.recipe``.
    """
    for name, value in (("n", n), ("k", k)):
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            raise ValueError(f"{name} must be a positive int, got {value!r}")
    _check_arch(arch)
    if device is None:
        device = torch.device("cuda", torch.cuda.current_device()) if torch.cuda.is_available() else "cpu"
    return _auto(n, k, torch.device(device), arch)


def _check_backend_type(backend) -> None:
    """``backend`` is a name (str) or a Recipe."""
    if not isinstance(backend, (str, Recipe)):
        raise TypeError(f"backend must be a backend name, 'auto' or a Recipe, got {type(backend).__name__}")


def _resolve(backend, arch: int | None, device: torch.device, n: int | None, k: int | None) -> Recipe:
    """The recipe for ``backend`` (a name, ``"auto"`` or a Recipe): ``arch`` defaults to the
    device's (9 for a CPU device)."""
    _check_arch(arch)
    if isinstance(backend, Recipe):
        if arch is not None and backend.backend != "reference" and arch != backend.arch:
            raise ValueError(f"arch={arch} contradicts backend={backend.name!r}")
        return backend
    _check_backend_type(backend)
    if backend == "auto":
        return _auto(n, k, device, arch)
    if arch is None:
        arch = _device_arch(device) or 9
    return recipe(backend, arch)


# --------------------------------------------------------------------------------------------
# Operands
# --------------------------------------------------------------------------------------------


def _quantize(x: torch.Tensor, fmt: ActivationFormat, eps: float = 1e-10) -> QuantizedActivation:
    q, s = per_token_group_quant(x, fmt.group_size, scale_layout=fmt.scale_layout, ue8m0=fmt.ue8m0, eps=eps)
    return QuantizedActivation(q, s, fmt)


def quantize_activation(
    x: torch.Tensor, backend: str | Recipe = "auto", *, arch: int | None = None, eps: float = 1e-10
) -> QuantizedActivation:
    """Quantize activations in the format ``backend`` reads (1 x 128 groups).

    Args:
        x: ``[M, K]`` (or ``[B, M, K]``, batched scales as SPEC.md section 2) bfloat16, float16
            or float32, K a multiple of 128.
        backend: ``"deep_gemm"``, ``"scaled_mm"``, ``"cutlass"``, ``"triton"``, ``"reference"``,
            a Recipe (``weight.recipe``: the surest way to match a prepared weight), or
            ``"auto"``: :func:`select_backend`'s choice for K (N unknown: assumed aligned).
        arch: compute capability major (9 or 10); defaults to x's device, 9 for CPU tensors.
        eps: lower bound of each group's amax (see :func:`fp8quant.per_token_group_quant`).

    Returns:
        ``QuantizedActivation(q, scale, format)``; :func:`linear` takes it with a weight of the
        same recipe. No rows are padded here: a GEMM needing M aligned (the recipe's ``m_align``)
        gets padded copies from :func:`linear`, or from the caller of another engine.
    """
    if not isinstance(x, torch.Tensor):
        raise TypeError(f"x must be a torch.Tensor, got {type(x).__name__}")
    if x.dim() not in (2, 3):
        raise ValueError(f"x must be 2-D [M, K] or 3-D [B, M, K], got shape {tuple(x.shape)}")
    r = _resolve(backend, arch, x.device, None, x.shape[-1])
    return _quantize(x, r.activation, eps)


def _check_weight_shape(r: Recipe, n: int, k: int) -> None:
    group = r.activation.group_size
    if k % group:
        raise ValueError(
            f"weight K={k} must be a multiple of {group}: activations are quantized in groups of {group} along K"
        )
    if not _fits(r, n, k):
        raise ValueError(
            f"backend {r.name!r} needs N % {r.n_align} == 0 and K % {r.k_align} == 0, got weight [N={n}, K={k}]"
        )


def _block_scale_form(s: torch.Tensor, n: int, fmt: WeightFormat) -> torch.Tensor:
    """fp32 block scales ``[nb, kb]`` in the weight format's form."""
    if fmt.scales == "sm100_packed":
        return pack.sm100_weight_scales(s.contiguous(), n)
    if fmt.scale_cols_align == 1:
        return s.contiguous()
    nb, kb = s.shape
    buf = s.new_zeros((nb, align(kb, fmt.scale_cols_align)))  # padding columns 0
    buf[:, :kb].copy_(s)
    return buf[:, :kb]


def prepare_weight(
    weight: torch.Tensor | tuple[torch.Tensor, torch.Tensor],
    backend: str | Recipe = "auto",
    *,
    arch: int | None = None,
    device: torch.device | str | None = None,
) -> QuantizedWeight:
    """Quantize a weight once, in the form ``backend`` reads (128 x 128 blocks).

    Args:
        weight: bfloat16, float16 or float32 ``[N, K]`` (quantized by
            :func:`fp8quant.per_block_quant`), or a pair ``(w_fp8, weight_scale_inv)``: a
            DeepSeek-V3 checkpoint's float8_e4m3fn ``[N, K]`` and fp32 ``[ceil(N/128),
            ceil(K/128)]``, used as they are where the recipe reads fp32 scales and re-quantized
            with power-of-two scales (:func:`fp8quant.requantize_ue8m0`) where it reads UE8M0.
        backend: a backend name, a Recipe or ``"auto"`` (:func:`select_backend`).
        arch: compute capability major (9 or 10); defaults to the weight's device, 9 on the CPU
            (``"auto"`` on the CPU: the reference).
        device: move the weight there first (a checkpoint loaded on the CPU).

    Returns:
        ``QuantizedWeight(q, scale, format, recipe)``: scales fp32 ``[nb, kb]`` contiguous, or
        the ``[nb, kb]`` view of a zero-padded ``[nb, align(kb, 4)]`` buffer (``scaled_mm``), or
        int32 ``[N, ceil(kb/4)]`` packed rows (``deep_gemm`` on SM100).
    """
    if isinstance(weight, (tuple, list)):
        if len(weight) != 2:
            raise TypeError(f"weight must be a tensor or a (w_fp8, weight_scale_inv) pair, got {len(weight)} items")
        w_q, w_s = weight
        if not isinstance(w_q, torch.Tensor) or w_q.dtype != FP8_DTYPE or w_q.dim() != 2:
            raise TypeError("weight[0] must be a float8_e4m3fn tensor [N, K]")
        n, k = w_q.shape
        want = (-(-n // 128), -(-k // 128))
        if not isinstance(w_s, torch.Tensor) or w_s.dtype != torch.float32 or tuple(w_s.shape) != want:
            got = f"{w_s.dtype} {tuple(w_s.shape)}" if isinstance(w_s, torch.Tensor) else type(w_s).__name__
            raise ValueError(
                f"weight[1] (weight_scale_inv) must be float32 of shape {want} for weight[0] [{n}, {k}], got {got}"
            )
        if w_s.device != w_q.device:
            raise ValueError(f"weight[1] is on {w_s.device}, weight[0] on {w_q.device}: both must be on one device")
        if device is not None:
            w_q, w_s = w_q.to(device), w_s.to(device)
        where = w_q.device
    elif isinstance(weight, torch.Tensor):
        if weight.dtype not in INPUT_DTYPES:
            raise TypeError(
                f"weight must be bfloat16, float16 or float32 (or a (w_fp8, scale) pair), got {weight.dtype}"
            )
        if weight.dim() != 2:
            raise ValueError(f"weight must be 2-D [N, K], got shape {tuple(weight.shape)}")
        if device is not None:
            weight = weight.to(device)
        n, k = weight.shape
        where = weight.device
    else:
        raise TypeError(f"weight must be a tensor or a (w_fp8, weight_scale_inv) pair, got {type(weight).__name__}")
    r = _resolve(backend, arch, where, n, k)
    _check_weight_shape(r, n, k)
    fmt = r.weight
    if isinstance(weight, torch.Tensor):
        q, s = per_block_quant(weight, fmt.block, ue8m0=fmt.ue8m0)
    elif fmt.ue8m0:
        from .weights import requantize_ue8m0  # noqa: PLC0415

        q, s = requantize_ue8m0(w_q.contiguous(), w_s.contiguous(), fmt.block)
    else:
        q, s = w_q.contiguous(), w_s
    return QuantizedWeight(q, _block_scale_form(s, n, fmt), fmt, r)


def _check_strides(t: torch.Tensor, shape: tuple, stride: tuple, what: str, fmt) -> None:
    """``t`` has ``shape`` and ``stride`` (those of size-1 dimensions do not matter). ``fmt`` is
    named only in the error: under torch.compile its integers may be symbolic."""
    ok = t.dim() == len(shape)
    for size, got_size, got, want in zip(shape, t.shape, t.stride(), stride):  # no generator: traceable
        ok = ok and got_size == size and (size <= 1 or got == want)
    if not ok:
        raise FormatMismatchError(
            f"{what} must have shape {tuple(shape)} and strides {tuple(stride)} for format {fmt.name!r}, "
            f"got {tuple(t.shape)} and {tuple(t.stride())}"
        )


def _check_weight(w: QuantizedWeight, backend) -> None:
    """A QuantizedWeight whose parts agree with its recipe, and with ``backend`` if one is named
    (``backend`` itself checked first: ``"auto"``, a name of BACKENDS or a Recipe)."""
    _check_backend_type(backend)
    if isinstance(backend, str) and backend != "auto" and backend not in BACKENDS:
        raise ValueError(f"unknown backend {backend!r}: backend must be 'auto', one of {BACKENDS} or a Recipe")
    r, fmt = w.recipe, w.format
    if not isinstance(r, Recipe) or not isinstance(fmt, WeightFormat):
        raise TypeError("weight.recipe must be a Recipe and weight.format a WeightFormat (use prepare_weight)")
    if isinstance(backend, Recipe) and not (backend is r or backend == r):
        raise FormatMismatchError(
            f"backend {backend.name!r} (weights {backend.weight.name}) does not match the weight, prepared for "
            f"{r.name!r} (weights {fmt.name})"
        )
    if isinstance(backend, str) and backend not in ("auto", r.backend):
        try:
            other = recipe(backend, r.arch)
            reads = f" (activations {other.activation.name}, weights {other.weight.name})"
        except ValueError:
            reads = ""
        raise FormatMismatchError(
            f"backend={backend!r}{reads} does not match the weight, prepared for {r.name!r} (activations "
            f"{r.activation.name}, weights {fmt.name}): prepare it for {backend!r}, or pass backend='auto'"
        )
    if not (fmt is r.weight or fmt == r.weight):
        raise FormatMismatchError(
            f"weight.format {fmt.name!r} differs from its recipe {r.name!r}'s weights ({r.weight.name})"
        )
    if w.q.dtype != FP8_DTYPE or w.q.dim() != 2:
        raise TypeError(f"weight.q must be float8_e4m3fn [N, K], got {w.q.dtype} of shape {tuple(w.q.shape)}")
    n, k = w.q.shape
    kb = -(-k // fmt.block[1])
    if fmt.scales == "sm100_packed":
        spec = scale_spec("packed_ue8m0", n, kb)
        _check_strides(w.scale, spec.shape, spec.stride, "weight.scale", fmt)
    else:
        cols = align(kb, fmt.scale_cols_align)
        _check_strides(w.scale, (-(-n // fmt.block[0]), kb), (cols, 1), "weight.scale", fmt)


def _check_activation(xq: QuantizedActivation, r: Recipe, k: int) -> None:
    fmt = xq.format
    if not isinstance(fmt, ActivationFormat):
        raise TypeError("x.format must be an ActivationFormat (use quantize_activation)")
    if not (fmt is r.activation or fmt == r.activation):
        raise FormatMismatchError(
            f"activation format {fmt.name!r} does not match {r.name!r}, which reads activations as "
            f"{r.activation.name!r}: quantize with quantize_activation(x, weight.recipe)"
        )
    if xq.q.dtype != FP8_DTYPE or xq.q.dim() != 2 or xq.q.shape[-1] != k:
        raise ValueError(f"x.q must be float8_e4m3fn [M, {k}], got {xq.q.dtype} of shape {tuple(xq.q.shape)}")
    spec = scale_spec(fmt.scale_layout, xq.q.shape[0], k // fmt.group_size)
    _check_strides(xq.scale, spec.shape, spec.stride, "x.scale", fmt)


# --------------------------------------------------------------------------------------------
# The GEMMs
# --------------------------------------------------------------------------------------------


def _quantize_padded(x: torch.Tensor, fmt: ActivationFormat) -> tuple[torch.Tensor, torch.Tensor]:
    """``x [M, K]`` quantized for torch._scaled_mm: q ``[Mp, K]`` and fp32 scales ``[Mp, G]`` of
    strides ``(1, Mp)``, ``Mp = align(M, 4)``, rows past M zero (q) with zero or eps scales."""
    m, k = x.shape
    mp, g = align(m, _SCALED_MM_ROWS), k // fmt.group_size
    if tracing():
        # torch.compile cannot trace out= into a padded scale buffer: quantize zero rows instead
        xp = torch.nn.functional.pad(x, (0, 0, 0, mp - m)) if mp != m else x
        return per_token_group_quant(xp, fmt.group_size, scale_layout=fmt.scale_layout, ue8m0=fmt.ue8m0)
    q = torch.empty((mp, k), dtype=FP8_DTYPE, device=x.device)
    if mp != m:
        q[m:].view(torch.uint8).zero_()
    s = empty_scale(fmt.scale_layout, m, g, device=x.device)  # mn_tma: the kernel zeroes rows M..Mp-1
    per_token_group_quant(x, fmt.group_size, scale_layout=fmt.scale_layout, ue8m0=fmt.ue8m0, out=(q[:m], s))
    return q, s.as_strided((mp, g), (1, mp))


def _pad_rows(xq: QuantizedActivation) -> tuple[torch.Tensor, torch.Tensor]:
    """A quantized activation's q and mn_tma scales with M padded to 4 (copies when M % 4 != 0)."""
    q, s = xq.q, xq.scale
    m, k = q.shape
    mp = align(m, _SCALED_MM_ROWS)
    if mp == m:  # mn_tma strides are (1, M) already
        return q, s
    q_full = q.new_empty((mp, k))
    q_full[m:].view(torch.uint8).zero_()
    q_full[:m].copy_(q)
    s_full = s.new_zeros((s.shape[1], mp)).t()
    s_full[:m].copy_(s)
    return q_full, s_full


def _scaled_mm_eager(
    a: torch.Tensor, b: torch.Tensor, scale_a: torch.Tensor, scale_b: torch.Tensor, out_dtype: torch.dtype, padded: bool
) -> torch.Tensor:
    """``torch._scaled_mm`` with 1 x 128 / 128 x 128 scales; ``padded``: ``scale_b`` is the whole
    ``[align(kb, 4), nb]`` buffer, which only ``torch.nn.functional.scaled_mm`` takes."""
    if not padded:
        return torch._scaled_mm(a, b, scale_a, scale_b, out_dtype=out_dtype)
    functional = torch.nn.functional
    st = functional.ScalingType
    return functional.scaled_mm(a, b, scale_a, st.BlockWise1x128, scale_b, st.BlockWise128x128, output_dtype=out_dtype)


@torch.library.custom_op("fp8quant::scaled_mm_blockwise", mutates_args=())
def _scaled_mm_op(
    a: torch.Tensor, b: torch.Tensor, scale_a: torch.Tensor, scale_b: torch.Tensor, out_dtype: torch.dtype, padded: bool
) -> torch.Tensor:
    """:func:`_scaled_mm_eager` as one opaque op for torch.compile: Dynamo cannot trace the builtin
    behind ``F.scaled_mm``, and Inductor's lowering of ``torch._scaled_mm`` cannot tell the block
    scales' kind once the weight's shape is symbolic (``dynamic=True``)."""
    return _scaled_mm_eager(a, b, scale_a, scale_b, out_dtype, padded)


@_scaled_mm_op.register_fake
def _(a, b, scale_a, scale_b, out_dtype, padded):
    return a.new_empty((a.shape[0], b.shape[1]), dtype=out_dtype)


def _scaled_mm(a_q: torch.Tensor, a_s: torch.Tensor, w: QuantizedWeight, out_dtype: torch.dtype) -> torch.Tensor:
    """``a_q [Mp, K]`` (Mp % 4 == 0) with scales ``[Mp, G]`` of strides (1, Mp) times the weight:
    ``[Mp, N]``."""
    nb, kb = w.scale.shape
    padded = kb % 4 != 0
    if not padded:
        scale_b = w.scale.t()
    elif _have_scaled_mm_v2():
        # torch._scaled_mm refuses the padded scales (and misreads unpadded ones): the explicit-recipe
        # API takes the whole [nb, align(kb, 4)] buffer, transposed
        scale_b = w.scale.as_strided((nb, align(kb, 4)), (align(kb, 4), 1)).t()
    else:
        raise RuntimeError(
            f"K={w.q.shape[1]} gives ceil(K / 128) = {kb}, not a multiple of 4: torch._scaled_mm cannot take "
            f"these weight scales, and this torch ({torch.__version__}) has no torch.nn.functional.scaled_mm"
        )
    run = _scaled_mm_op if tracing() else _scaled_mm_eager  # eager: no dispatcher in the way
    return run(a_q, w.q.t(), a_s, scale_b, out_dtype, padded)


def _check_deep_gemm_out_dtype(out_dtype: torch.dtype, arch: int) -> None:
    """DeepGEMM 2.6.1 runs fp32-scaled operands on SM90 (``arch`` 9, the device's compute
    capability) through its 1D2D kernel, which asserts a bfloat16 output; SM100's 1D1D kernel
    writes bfloat16 or float32. Refused here instead of inside DeepGEMM."""
    if arch == 9 and out_dtype != torch.bfloat16:
        raise ValueError(
            f"out_dtype {out_dtype}: SM90's DeepGEMM (fp8_gemm_nt's 1D2D kernel) writes bfloat16 only; "
            "pass out_dtype=torch.bfloat16, or use backend='scaled_mm' for another output dtype"
        )


def _deep_gemm(xq: QuantizedActivation, w: QuantizedWeight, out_dtype: torch.dtype) -> torch.Tensor:
    """``deep_gemm.fp8_gemm_nt`` into a new ``[M, N]`` output: fp32 mn_tma and [nb, kb] scales on
    SM90; packed UE8M0 activation and weight rows with recipe (1, 1, 128) on SM100."""
    deep_gemm, error = _import_deep_gemm()
    if deep_gemm is None:
        raise ImportError(
            f"backend {w.recipe.name!r} needs DeepGEMM (the deep_gemm package), which does not import: "
            f"{type(error).__name__}: {error}"
        ) from error
    out = torch.empty((xq.q.shape[0], w.q.shape[0]), dtype=out_dtype, device=xq.q.device)
    if w.recipe.arch == 10:
        deep_gemm.fp8_gemm_nt((xq.q, xq.scale), (w.q, w.scale), out, recipe=(1, 1, 128))
    else:
        deep_gemm.fp8_gemm_nt((xq.q, xq.scale), (w.q, w.scale), out)
    return out


def _dequantize_activation(xq: QuantizedActivation) -> torch.Tensor:
    """float32 ``q * scale`` of every group."""
    q, s, fmt = xq
    if fmt.scale_layout == "packed_ue8m0":
        s = pack.unpack_ue8m0(s, q.shape[-1] // fmt.group_size, "row")
    return reference.dequantize_groups(q, s, fmt.group_size)


def _dequantize_weight(w: QuantizedWeight) -> torch.Tensor:
    """float32 ``q * scale`` of every block."""
    k = w.q.shape[-1]
    bn, bk = w.format.block
    if w.format.scales == "sm100_packed":  # [N, kb]: each row its block row's scales
        return reference.dequantize_blocks(w.q, pack.unpack_ue8m0(w.scale, -(-k // bk), "row"), (1, bk))
    return reference.dequantize_blocks(w.q, w.scale, (bn, bk))


def _reference(xq: QuantizedActivation, w: QuantizedWeight, out_dtype: torch.dtype) -> torch.Tensor:
    return (_dequantize_activation(xq) @ _dequantize_weight(w).t()).to(out_dtype)


def linear(
    x: torch.Tensor | QuantizedActivation,
    weight: QuantizedWeight | torch.Tensor | tuple[torch.Tensor, torch.Tensor],
    backend: str | Recipe = "auto",
    *,
    out_dtype: torch.dtype = torch.bfloat16,
) -> torch.Tensor:
    """``y = x @ w.T`` with FP8 operands in the formats of the weight's recipe.

    Args:
        x: bfloat16, float16 or float32 ``[..., K]`` (quantized here; leading dimensions are
            flattened and restored), or a :class:`QuantizedActivation` ``[M, K]`` of the weight's
            recipe.
        weight: a :class:`QuantizedWeight`, or what :func:`prepare_weight` takes (prepared on
            every call, for x's device).
        backend: ``"auto"`` follows ``weight.recipe``; a name or Recipe must match it (else
            :class:`FormatMismatchError`, naming both formats); for an unprepared weight it
            chooses the recipe.
        out_dtype: bfloat16 (default), float16 or float32 (DeepGEMM: bfloat16 on SM90, bfloat16
            or float32 on SM100).

    Returns:
        ``[..., N]`` of ``out_dtype``. Recipes with ``runner=False`` (``"cutlass"``,
        ``"triton"``) are refused: call that engine's kernel with :func:`quantize_activation` and
        :func:`prepare_weight` outputs.
    """
    if isinstance(x, QuantizedActivation):
        device = x.q.device
    elif isinstance(x, torch.Tensor):
        device = x.device
    else:
        raise TypeError(f"x must be a torch.Tensor or a QuantizedActivation, got {type(x).__name__}")
    if isinstance(weight, QuantizedWeight):
        _check_weight(weight, backend)
    else:
        weight = prepare_weight(weight, backend, device=device)
    r = weight.recipe
    if not r.runner:
        raise ValueError(
            f"fp8quant.linear does not run {r.name!r} (its recipe gives formats only): call that engine's "
            "kernel with quantize_activation(x, weight.recipe) and prepare_weight(...) outputs"
        )
    if out_dtype not in (_DEEP_GEMM_OUT_DTYPES if r.backend == "deep_gemm" else _OUT_DTYPES):
        raise ValueError(f"out_dtype {out_dtype} is not one {r.name!r} writes")
    if r.backend == "deep_gemm":  # DeepGEMM picks its kernel by the GPU's arch (the recipe's off CUDA)
        gpu_arch = _device_arch(device)
        if gpu_arch not in (None, r.arch):  # it would read the other arch's scales without an error
            raise FormatMismatchError(
                f"the weight was prepared for {r.name!r} (weights {weight.format.name}), but this GPU is "
                f"sm_{gpu_arch}x, where DeepGEMM reads another format: prepare the weight for this GPU"
            )
        _check_deep_gemm_out_dtype(out_dtype, gpu_arch or r.arch)
    if weight.q.device != device:
        raise ValueError(f"x is on {device}, the weight on {weight.q.device}: both must be on one device")
    n, k = weight.q.shape
    if isinstance(x, QuantizedActivation):
        _check_activation(x, r, k)
        lead, xq, x2 = x.q.shape[:-1], x, None
    else:
        if x.dtype not in INPUT_DTYPES:
            raise TypeError(f"x must be bfloat16, float16 or float32 (or a QuantizedActivation), got {x.dtype}")
        if x.dim() < 1 or x.shape[-1] != k:
            raise ValueError(f"x must be [..., K] with K = {k} (the weight's), got shape {tuple(x.shape)}")
        lead, xq, x2 = x.shape[:-1], None, x.reshape(-1, k)
    m = (xq.q if x2 is None else x2).shape[0]
    if m == 0:
        return torch.empty((*lead, n), dtype=out_dtype, device=device)
    if r.backend == "scaled_mm" and device.type == "cuda":
        a_q, a_s = _pad_rows(xq) if x2 is None else _quantize_padded(x2, r.activation)
        y = _scaled_mm(a_q, a_s, weight, out_dtype)[:m]
    else:
        xq = _quantize(x2, r.activation) if x2 is not None else xq
        y = _deep_gemm(xq, weight, out_dtype) if r.backend == "deep_gemm" else _reference(xq, weight, out_dtype)
    return y.reshape(*lead, n)


def calc_diff(x: torch.Tensor, y: torch.Tensor) -> float:
    """``1 - 2 sum(x*y) / sum(x*x + y*y)`` in float64 (SPEC.md section 4): the global similarity
    metric DeepGEMM's and vLLM's tests report; 0 for identical tensors, 1 for ``y = 0``."""
    x, y = x.double(), y.double()
    return float(1 - 2 * (x * y).sum() / (x * x + y * y).sum())
