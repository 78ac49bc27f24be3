"""Grouped block-FP8 GEMMs for mixture-of-experts layers, written in Triton: they read the two MoE
layouts DeepGEMM's grouped GEMMs read, with DeepGEMM 2.6.1's call shapes, so that an MoE layer can
run where DeepGEMM is missing.

    from fp8quant import grouped_gemm
    grouped_gemm.grouped_gemm_contiguous((a_q, a_s), (w_q, w_s), d, m_indices)        # prefill
    grouped_gemm.grouped_gemm_masked((a_q, a_s), (w_q, w_s), d, masked_m, expected_m)  # decode
    grouped_gemm.grouped_gemm_torch((a_q, a_s), (w_q, w_s), d, m_indices=m_indices)   # any device

For each expert e, ``d = a @ w[e].T`` with FP8 e4m3 operands and float32 block scales, written as
bfloat16: ``d[m, n] = sum_kb (a_q[m, kb] . w_q[e, n, kb]) * a_s[m, kb] * w_s[e, n // 128, kb]``,
``kb`` running over the 128-wide K blocks; each block's FP8 product is summed in float32 and then
scaled, as DeepGEMM does.

Layouts (checked on every call: dtype, shape and strides, one device):

- weights, both GEMMs: ``w_q`` float8_e4m3fn ``[E, N, K]`` contiguous; ``w_s`` float32
  ``[E, ceil(N/128), K/128]`` contiguous (one scale per 128 x 128 block). K % 128 == 0.
- contiguous: ``a_q`` float8_e4m3fn ``[M, K]`` (row stride >= K, last dim contiguous); ``a_s``
  float32 ``[M, K/128]`` of strides exactly ``(1, align(M, 4))`` (``scale_layout="mn_tma"``);
  ``d`` bfloat16 ``[M, N]`` (row stride >= N, last dim contiguous); ``m_indices`` int32 ``[M]``,
  the expert of each row, -1 on padding rows (any id outside ``[0, E)`` is padding). Each
  expert's rows form one segment that starts at a multiple of the tile height
  (``kernel_config(expected_m, contiguous=True).block_m``: 16, 64 or 128 rows; 128, DeepGEMM's
  contiguous alignment, suits every tile): a tile of rows takes its expert from its first row, is
  skipped when that row is padding, and reads and writes only the rows of that expert. Padding rows of ``d`` are never written, whatever ``a_q`` and ``a_s``
  hold there (NaN included).
- masked: ``a_q`` float8_e4m3fn ``[E, max_m, K]`` (last dim contiguous, row and expert strides
  free); ``a_s`` float32 ``[E, max_m, K/128]`` of strides exactly ``(Ma * K/128, 1, Ma)``,
  ``Ma = align(max_m, 4)`` (batched ``mn_tma``); ``d`` bfloat16 ``[E, max_m, N]`` (last dim
  contiguous); ``masked_m`` int32 ``[E]``: rows ``< masked_m[e]`` of expert e are valid (values
  are clamped to ``[0, max_m]``); other rows are neither read nor written. ``expected_m`` (host
  int, typical rows per expert) picks the tile shape, as in DeepGEMM, and how many programs share
  an expert's row tiles: each program loops over its expert's tiles below ``masked_m[e]``, so an
  idle expert costs one load per program whatever max_m is.

The Triton functions make no host synchronization and no value-dependent allocation: the launch
grid depends on shapes and ``expected_m`` only, so they can be captured in CUDA graphs (a first
call inside the capture compiles the kernel there; warming up first is still the usual way). Tile shapes come from a fixed table (:func:`kernel_config`), not autotuning.
An eager call's host time (checks and Triton's launch) is of the order of a decode-size GEMM's
GPU time (BENCHMARKS.md): decode should run them in a CUDA graph. Triton is optional: this module
imports without it, :func:`available` says whether the kernels can run, and the Triton functions
raise RuntimeError without it. :func:`grouped_gemm_torch` computes the same products in PyTorch
on any device (dequantize, float32 matmul per expert); it synchronizes with the device, and is
the CPU path and the tests' oracle.
"""

from __future__ import annotations

from typing import NamedTuple

import torch

from .reference import dequantize_blocks, dequantize_groups

try:
    import triton
    import triton.language as tl
except ImportError as _exc:  # Triton is optional: the CPU machines (and CI) have none
    triton = None
    tl = None
    _TRITON_IMPORT_ERROR: ImportError | None = _exc
else:
    _TRITON_IMPORT_ERROR = None

__all__ = [
    "KernelConfig",
    "available",
    "grouped_gemm_contiguous",
    "grouped_gemm_masked",
    "grouped_gemm_torch",
    "kernel_config",
]

_FP8 = torch.float8_e4m3fn
_BLOCK = 128  # the K block of one scale column, and the N block of one weight scale row
_TMA_ROWS = 4  # mn_tma scale columns are padded to a multiple of 4 rows (16 bytes)


# --------------------------------------------------------------------------------------------
# Tile configurations
# --------------------------------------------------------------------------------------------


class KernelConfig(NamedTuple):
    """A kernel's tile shape and launch options. ``block_m`` divides 128 (so that a tile of the
    contiguous layout lies in one expert's segment) and is at least 16 (``tl.dot``'s minimum)."""

    block_m: int
    block_n: int
    num_warps: int
    num_stages: int


# Rows per expert up to the bound -> config; the first row whose bound holds is taken. Chosen by
# the sweeps in BENCHMARKS.md ("Grouped GEMM tiles"):
# - up to 16 rows the GEMM reads each active expert's weights once and is bound by that read:
#   16-row tiles (tl.dot's minimum), 64 columns wide, 3 stages;
# - 17 to 64 rows: 64 x 128 tiles over 4 warps (one wgmma warpgroup), 3 stages;
# - more: 128 x 128 tiles over 8 warps, 3 stages.
_CONFIGS: tuple[tuple[int | None, KernelConfig], ...] = (
    (16, KernelConfig(16, 64, 4, 3)),
    (64, KernelConfig(64, 128, 4, 3)),
    (None, KernelConfig(128, 128, 8, 3)),
)
# The contiguous GEMM without a hint: 64-row tiles, a little slower than 128-row ones with
# thousands of rows per expert (BENCHMARKS.md), but they skip a segment's padding tail of 64 rows and more, and
# keep decode-sized segments (a few rows each) bound by the weight read
_CONTIGUOUS_DEFAULT = KernelConfig(64, 128, 4, 3)


def kernel_config(expected_m: int | None, *, contiguous: bool = False) -> KernelConfig:
    """The tile configuration for ``expected_m`` rows per expert (a host-side hint); None: the
    contiguous GEMM's default (64-row tiles), or the largest tiles for the masked one."""
    if expected_m is None:
        return _CONTIGUOUS_DEFAULT if contiguous else _CONFIGS[-1][1]
    for bound, cfg in _CONFIGS:
        if bound is None or expected_m <= bound:
            return cfg
    raise AssertionError("unreachable: the last config has no bound")


def available() -> bool:
    """Whether the Triton kernels can run here: Triton imports and a CUDA device is present."""
    return triton is not None and torch.cuda.is_available()


# --------------------------------------------------------------------------------------------
# Argument checks
# --------------------------------------------------------------------------------------------


def _pair(x, name: str) -> tuple[torch.Tensor, torch.Tensor]:
    if not isinstance(x, (tuple, list)) or len(x) != 2 or not all(isinstance(t, torch.Tensor) for t in x):
        got = f"{len(x)} items" if isinstance(x, (tuple, list)) else type(x).__name__
        raise TypeError(f"{name} must be a pair of tensors ({name}_q float8_e4m3fn, {name}_s float32), got {got}")
    return x[0], x[1]


def _check_tensor(t, name: str, dtype: torch.dtype, shape: tuple[int, ...]) -> None:
    if not isinstance(t, torch.Tensor):
        raise TypeError(f"{name} must be a torch.Tensor, got {type(t).__name__}")
    if t.dtype != dtype:
        raise TypeError(f"{name} must be {dtype}, got {t.dtype}")
    if tuple(t.shape) != tuple(shape):
        raise ValueError(f"{name} must have shape {tuple(shape)}, got {tuple(t.shape)}")


def _check_strides(t: torch.Tensor, name: str, stride: tuple[int, ...], what: str) -> None:
    """``t``'s strides are ``stride`` (those of dimensions of size 1 do not matter)."""
    if any(size > 1 and got != want for size, got, want in zip(t.shape, t.stride(), stride)):
        raise ValueError(f"{name} must have strides {tuple(stride)} ({what}), got {tuple(t.stride())}")


def _check_rows(t: torch.Tensor, name: str) -> None:
    """Row-major with padding allowed: the last dimension contiguous, each outer dimension's stride
    at least the span of the dimensions inside it (no two elements share memory)."""
    ok = t.shape[-1] <= 1 or t.stride(-1) == 1
    span = 1 + max(t.shape[-1] - 1, 0)  # elements from the first to the last of one row, plus one
    for size, stride in zip(reversed(t.shape[:-1]), reversed(t.stride()[:-1])):
        if size > 1:
            ok = ok and stride >= span
            span += stride * (size - 1)
    if not ok:
        raise ValueError(
            f"{name} must be row-major with its last dimension contiguous (outer strides may be padded), "
            f"got shape {tuple(t.shape)} and strides {tuple(t.stride())}"
        )


def _check_int_vector(t, name: str, n: int, what: str) -> None:
    _check_tensor(t, name, torch.int32, (n,))
    if n > 1 and t.stride(0) != 1:
        raise ValueError(f"{name} must be contiguous ({what}), got stride {t.stride(0)}")


def _check_weights(b, num_experts: int | None, k: int) -> tuple[torch.Tensor, torch.Tensor, int, int]:
    """``b = (w_q [E, N, K], w_s [E, ceil(N/128), K/128])``; returns ``(w_q, w_s, E, N)``."""
    w_q, w_s = _pair(b, "b")
    if w_q.dtype != _FP8 or w_q.dim() != 3:
        raise TypeError(f"b[0] (w_q) must be float8_e4m3fn [E, N, K], got {w_q.dtype} of shape {tuple(w_q.shape)}")
    e, n, wk = w_q.shape
    if wk != k:
        raise ValueError(f"b[0] (w_q) must have K = {k} (a[0]'s last dimension), got shape {tuple(w_q.shape)}")
    if num_experts is not None and e != num_experts:
        raise ValueError(f"b[0] (w_q) must have E = {num_experts} experts, got shape {tuple(w_q.shape)}")
    if not w_q.is_contiguous():
        raise ValueError(f"b[0] (w_q) must be contiguous, got strides {tuple(w_q.stride())}")
    _check_tensor(w_s, "b[1] (w_s)", torch.float32, (e, -(-n // _BLOCK), k // _BLOCK))
    if not w_s.is_contiguous():
        raise ValueError(f"b[1] (w_s) must be contiguous, got strides {tuple(w_s.stride())}")
    return w_q, w_s, e, n


def _check_activation_q(a_q, dims: str, ndim: int) -> int:
    if a_q.dtype != _FP8 or a_q.dim() != ndim:
        raise TypeError(f"a[0] (a_q) must be float8_e4m3fn {dims}, got {a_q.dtype} of shape {tuple(a_q.shape)}")
    k = a_q.shape[-1]
    if k == 0 or k % _BLOCK:
        raise ValueError(f"K = {k} (a[0]'s last dimension) must be a positive multiple of {_BLOCK}")
    _check_rows(a_q, "a[0] (a_q)")
    return k


def _check_device(named: dict[str, torch.Tensor]) -> torch.device:
    device = next(iter(named.values())).device
    for name, t in named.items():
        if t.device != device:
            raise ValueError(f"{name} is on {t.device}, a[0] on {device}: every tensor must be on one device")
    return device


def _check_contiguous_args(a, b, d, m_indices) -> tuple:
    a_q, a_s = _pair(a, "a")
    k = _check_activation_q(a_q, "[M, K]", 2)
    m, g = a_q.shape[0], k // _BLOCK
    _check_tensor(a_s, "a[1] (a_s)", torch.float32, (m, g))
    _check_strides(a_s, "a[1] (a_s)", (1, -(-m // _TMA_ROWS) * _TMA_ROWS), "column-major, M padded to 4: mn_tma")
    w_q, w_s, e, n = _check_weights(b, None, k)
    _check_tensor(d, "d", torch.bfloat16, (m, n))
    _check_rows(d, "d")
    _check_int_vector(m_indices, "m_indices", m, "one expert id per row of a[0]")
    device = _check_device({"a[0]": a_q, "a[1]": a_s, "b[0]": w_q, "b[1]": w_s, "d": d, "m_indices": m_indices})
    return a_q, a_s, w_q, w_s, device


def _check_masked_args(a, b, d, masked_m) -> tuple:
    a_q, a_s = _pair(a, "a")
    k = _check_activation_q(a_q, "[E, max_m, K]", 3)
    e, max_m, g = a_q.shape[0], a_q.shape[1], k // _BLOCK
    _check_tensor(a_s, "a[1] (a_s)", torch.float32, (e, max_m, g))
    ma = -(-max_m // _TMA_ROWS) * _TMA_ROWS
    _check_strides(a_s, "a[1] (a_s)", (ma * g, 1, ma), "per expert column-major, max_m padded to 4: mn_tma")
    w_q, w_s, _, n = _check_weights(b, e, k)
    _check_tensor(d, "d", torch.bfloat16, (e, max_m, n))
    _check_rows(d, "d")
    _check_int_vector(masked_m, "masked_m", e, "valid rows of each expert")
    device = _check_device({"a[0]": a_q, "a[1]": a_s, "b[0]": w_q, "b[1]": w_s, "d": d, "masked_m": masked_m})
    return a_q, a_s, w_q, w_s, device


def _check_expected_m(expected_m, allow_none: bool) -> None:
    if expected_m is None and allow_none:
        return
    if isinstance(expected_m, bool) or not isinstance(expected_m, int):
        raise TypeError(f"expected_m must be an int (typical rows per expert), got {type(expected_m).__name__}")
    if expected_m < 0:
        raise ValueError(f"expected_m must be >= 0, got {expected_m}")


def _require_triton(device: torch.device) -> None:
    if triton is None:
        raise RuntimeError(
            f"fp8quant.grouped_gemm's kernels need Triton, which could not be imported ({_TRITON_IMPORT_ERROR}); "
            "grouped_gemm_torch computes the same products in PyTorch"
        )
    if device.type != "cuda":
        raise ValueError(
            f"the Triton grouped GEMMs take CUDA tensors, got tensors on {device}; "
            "grouped_gemm_torch computes the same products on any device"
        )


# --------------------------------------------------------------------------------------------
# Triton kernels
# --------------------------------------------------------------------------------------------

if triton is not None:

    @triton.jit
    def _tile(
        a_ptrs, as_ptrs, stride_as_k, b_ptrs, bs_ptrs, row_ok, n_ok, num_kb,
        BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
    ):  # fmt: skip
        """One [BLOCK_M, BLOCK_N] tile over every K block: fp8 x fp8 -> fp32 per 128-wide block,
        scaled by the rows' activation scales and the block's weight scale (a scalar when the
        tile's columns share one 128-row weight block, else one per column)."""
        acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
        for _ in range(num_kb):
            a = tl.load(a_ptrs, mask=row_ok[:, None], other=0.0)
            b = tl.load(b_ptrs, mask=n_ok[None, :], other=0.0)
            sa = tl.load(as_ptrs, mask=row_ok, other=0.0)
            if BLOCK_N <= BLOCK_K:
                sb = tl.load(bs_ptrs)
                acc += tl.dot(a, b) * (sa[:, None] * sb)
            else:
                sb = tl.load(bs_ptrs, mask=n_ok, other=0.0)
                acc += tl.dot(a, b) * (sa[:, None] * sb[None, :])
            a_ptrs += BLOCK_K
            b_ptrs += BLOCK_K
            as_ptrs += stride_as_k
            bs_ptrs += 1
        return acc

    @triton.jit
    def _weight_ptrs(b_ptr, bs_ptr, expert, pid_n, stride_be, stride_bn, stride_bse, stride_bsn,
                     BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr):  # fmt: skip
        """Pointers to the first K block of the expert's N block pid_n: w_q as [BLOCK_K, BLOCK_N]
        (K contiguous) and its scales (one pointer, or one per column when BLOCK_N > 128)."""
        e64 = expert.to(tl.int64)
        offs_n = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
        offs_k = tl.arange(0, BLOCK_K)
        b_ptrs = b_ptr + e64 * stride_be + offs_n[None, :].to(tl.int64) * stride_bn + offs_k[:, None]
        if BLOCK_N <= BLOCK_K:
            bs_ptrs = bs_ptr + e64 * stride_bse + ((pid_n * BLOCK_N) // BLOCK_K) * stride_bsn
        else:
            bs_ptrs = bs_ptr + e64 * stride_bse + (offs_n // BLOCK_K) * stride_bsn
        return b_ptrs, bs_ptrs

    @triton.jit
    def _contiguous_kernel(
        a_ptr, as_ptr, b_ptr, bs_ptr, d_ptr, idx_ptr,
        M, N, num_kb, num_experts,
        stride_am, stride_as_m, stride_as_k,
        stride_be, stride_bn, stride_bse, stride_bsn,
        stride_dm,
        BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
    ):  # fmt: skip
        # One program a [BLOCK_M, BLOCK_N] tile; the N block varies fastest, so that programs
        # launched together read one expert's weights
        pid = tl.program_id(0)
        num_nb = tl.cdiv(N, BLOCK_N)
        pid_n = pid % num_nb
        row0 = (pid // num_nb) * BLOCK_M
        expert = tl.load(idx_ptr + row0)
        if (expert < 0) | (expert >= num_experts):  # a padding tile (segments start at tile rows)
            return
        offs_m = row0 + tl.arange(0, BLOCK_M)
        ids = tl.load(idx_ptr + offs_m, mask=offs_m < M, other=-1)
        row_ok = ids == expert  # padding rows are neither read nor written
        rows = offs_m.to(tl.int64)
        offs_n = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
        n_ok = offs_n < N
        offs_k = tl.arange(0, BLOCK_K)
        a_ptrs = a_ptr + rows[:, None] * stride_am + offs_k[None, :]
        as_ptrs = as_ptr + rows * stride_as_m
        b_ptrs, bs_ptrs = _weight_ptrs(
            b_ptr, bs_ptr, expert, pid_n, stride_be, stride_bn, stride_bse, stride_bsn, BLOCK_N, BLOCK_K
        )
        acc = _tile(a_ptrs, as_ptrs, stride_as_k, b_ptrs, bs_ptrs, row_ok, n_ok, num_kb, BLOCK_M, BLOCK_N, BLOCK_K)
        d_ptrs = d_ptr + rows[:, None] * stride_dm + offs_n[None, :]
        tl.store(d_ptrs, acc.to(d_ptr.dtype.element_ty), mask=row_ok[:, None] & n_ok[None, :])

    @triton.jit
    def _masked_kernel(
        a_ptr, as_ptr, b_ptr, bs_ptr, d_ptr, count_ptr,
        max_m, N, num_kb, split_m,
        stride_ae, stride_am, stride_ase, stride_as_m, stride_as_k,
        stride_be, stride_bn, stride_bse, stride_bsn,
        stride_de, stride_dm,
        BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
    ):  # fmt: skip
        # One program per (expert, N block, slice s of split_m): it computes the expert's row
        # tiles s, s + split_m, ... below masked_m[e], so an idle expert costs one load a program
        # whatever max_m is. The N block varies fastest, then the slice, then the expert.
        pid = tl.program_id(0)
        num_nb = tl.cdiv(N, BLOCK_N)
        pid_n = pid % num_nb
        rest = pid // num_nb
        first = rest % split_m
        expert = rest // split_m
        count = tl.minimum(tl.maximum(tl.load(count_ptr + expert), 0), max_m)
        e64 = expert.to(tl.int64)
        offs_n = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
        n_ok = offs_n < N
        offs_k = tl.arange(0, BLOCK_K)
        b_ptrs, bs_ptrs = _weight_ptrs(
            b_ptr, bs_ptr, expert, pid_n, stride_be, stride_bn, stride_bse, stride_bsn, BLOCK_N, BLOCK_K
        )
        for tile in range(first, tl.cdiv(count, BLOCK_M), split_m):
            offs_m = tile * BLOCK_M + tl.arange(0, BLOCK_M)
            row_ok = offs_m < count  # rows past masked_m[e] are neither read nor written
            rows = offs_m.to(tl.int64)
            a_ptrs = a_ptr + e64 * stride_ae + rows[:, None] * stride_am + offs_k[None, :]
            as_ptrs = as_ptr + e64 * stride_ase + rows * stride_as_m
            acc = _tile(a_ptrs, as_ptrs, stride_as_k, b_ptrs, bs_ptrs, row_ok, n_ok, num_kb, BLOCK_M, BLOCK_N, BLOCK_K)
            d_ptrs = d_ptr + e64 * stride_de + rows[:, None] * stride_dm + offs_n[None, :]
            tl.store(d_ptrs, acc.to(d_ptr.dtype.element_ty), mask=row_ok[:, None] & n_ok[None, :])


def _launch(kernel, programs: int, device: torch.device, cfg: KernelConfig, *args) -> None:
    def run() -> None:
        kernel[(programs,)](
            *args, BLOCK_M=cfg.block_m, BLOCK_N=cfg.block_n, BLOCK_K=_BLOCK,
            num_warps=cfg.num_warps, num_stages=cfg.num_stages,
        )  # fmt: skip

    if device.index is not None and device.index != torch.cuda.current_device():
        with torch.cuda.device(device):  # Triton launches on the current device's current stream
            run()
    else:
        run()


# --------------------------------------------------------------------------------------------
# The GEMMs
# --------------------------------------------------------------------------------------------


def grouped_gemm_contiguous(
    a: tuple[torch.Tensor, torch.Tensor],
    b: tuple[torch.Tensor, torch.Tensor],
    d: torch.Tensor,
    m_indices: torch.Tensor,
    *,
    expected_m: int | None = None,
) -> None:
    """``d[m] = a[m] @ w[m_indices[m]].T`` for every row m of an expert (contiguous layout; see the
    module docstring): DeepGEMM's ``m_grouped_fp8_gemm_nt_contiguous(a, b, d, m_indices)``.

    Args:
        a: ``(a_q, a_s)``: float8_e4m3fn ``[M, K]`` and float32 ``[M, K/128]`` of strides
            ``(1, align(M, 4))``.
        b: ``(w_q, w_s)``: float8_e4m3fn ``[E, N, K]`` and float32 ``[E, ceil(N/128), K/128]``,
            both contiguous.
        d: bfloat16 ``[M, N]``, written on the rows of experts only.
        m_indices: int32 ``[M]``: each row's expert, -1 on padding rows; experts' segments start
            at multiples of the tile height (``kernel_config(expected_m, contiguous=True).block_m``;
            128 suits every tile).
        expected_m: typical rows per expert, to pick the tile shape (:func:`kernel_config`);
            None: 64-row tiles.
    """
    a_q, a_s, w_q, w_s, device = _check_contiguous_args(a, b, d, m_indices)
    _check_expected_m(expected_m, allow_none=True)
    _require_triton(device)
    m, k = a_q.shape
    e, n, _ = w_q.shape
    if m == 0 or n == 0 or e == 0:
        return
    cfg = kernel_config(expected_m, contiguous=True)
    programs = -(-m // cfg.block_m) * -(-n // cfg.block_n)
    _launch(
        _contiguous_kernel, programs, device, cfg,
        a_q, a_s, w_q, w_s, d, m_indices,
        m, n, k // _BLOCK, e,
        a_q.stride(0), a_s.stride(0), a_s.stride(1),
        w_q.stride(0), w_q.stride(1), w_s.stride(0), w_s.stride(1),
        d.stride(0),
    )  # fmt: skip


def grouped_gemm_masked(
    a: tuple[torch.Tensor, torch.Tensor],
    b: tuple[torch.Tensor, torch.Tensor],
    d: torch.Tensor,
    masked_m: torch.Tensor,
    expected_m: int,
) -> None:
    """``d[e, :masked_m[e]] = a[e, :masked_m[e]] @ w[e].T`` for every expert e (masked layout; see
    the module docstring): DeepGEMM's ``m_grouped_fp8_gemm_nt_masked(a, b, d, masked_m,
    expected_m)``.

    Args:
        a: ``(a_q, a_s)``: float8_e4m3fn ``[E, max_m, K]`` and float32 ``[E, max_m, K/128]`` of
            strides ``(Ma * K/128, 1, Ma)``, ``Ma = align(max_m, 4)``.
        b: ``(w_q, w_s)``: float8_e4m3fn ``[E, N, K]`` and float32 ``[E, ceil(N/128), K/128]``,
            both contiguous.
        d: bfloat16 ``[E, max_m, N]``, written on the valid rows only.
        masked_m: int32 ``[E]``: valid rows of each expert (clamped to ``[0, max_m]``).
        expected_m: typical rows per expert (host int): picks the tile shape
            (:func:`kernel_config`) and how many programs share an expert's row tiles.
    """
    a_q, a_s, w_q, w_s, device = _check_masked_args(a, b, d, masked_m)
    _check_expected_m(expected_m, allow_none=False)
    _require_triton(device)
    e, max_m, k = a_q.shape
    n = w_q.shape[1]
    if max_m == 0 or n == 0 or e == 0:
        return
    cfg = kernel_config(expected_m)
    # Programs per (expert, N block): enough for expected_m rows to be one tile each
    split_m = max(1, min(-(-max_m // cfg.block_m), -(-expected_m // cfg.block_m)))
    programs = e * split_m * -(-n // cfg.block_n)
    _launch(
        _masked_kernel, programs, device, cfg,
        a_q, a_s, w_q, w_s, d, masked_m,
        max_m, n, k // _BLOCK, split_m,
        a_q.stride(0), a_q.stride(1), a_s.stride(0), a_s.stride(1), a_s.stride(2),
        w_q.stride(0), w_q.stride(1), w_s.stride(0), w_s.stride(1),
        d.stride(0), d.stride(1),
    )  # fmt: skip


# --------------------------------------------------------------------------------------------
# The PyTorch path
# --------------------------------------------------------------------------------------------


def grouped_gemm_torch(
    a: tuple[torch.Tensor, torch.Tensor],
    b: tuple[torch.Tensor, torch.Tensor],
    d: torch.Tensor,
    m_indices: torch.Tensor | None = None,
    masked_m: torch.Tensor | None = None,
) -> None:
    """What :func:`grouped_gemm_contiguous` (``m_indices`` given) or :func:`grouped_gemm_masked`
    (``masked_m`` given) compute, in PyTorch on any device: each expert's rows and weights
    dequantized to float32, multiplied in float32, written to ``d`` as bfloat16. Same layouts and
    checks as the kernels; rows that are not an expert's (m_indices outside ``[0, E)``, masked rows)
    are neither read nor written. Reads ``m_indices``/``masked_m`` on the host (synchronizes):
    not for CUDA graphs. Float32 sums in another order than the kernels': a tolerance oracle.
    (With ``torch.backends.cuda.matmul.allow_tf32`` set, CUDA matmuls here run in TF32.)"""
    if (m_indices is None) == (masked_m is None):
        raise ValueError("pass exactly one of m_indices (contiguous layout) and masked_m (masked layout)")
    if m_indices is not None:
        a_q, a_s, w_q, w_s, _ = _check_contiguous_args(a, b, d, m_indices)
        ids = m_indices.long()
        for e in range(w_q.shape[0]):
            rows = (ids == e).nonzero().squeeze(1)
            if rows.numel() == 0:
                continue
            # fp8 by its bytes: index_select has no float8 kernel on every device
            q = a_q.view(torch.uint8).index_select(0, rows).view(_FP8)
            y = dequantize_groups(q, a_s.index_select(0, rows)) @ dequantize_blocks(w_q[e], w_s[e]).t()
            d.index_copy_(0, rows, y.to(d.dtype))
        return
    a_q, a_s, w_q, w_s, _ = _check_masked_args(a, b, d, masked_m)
    max_m = a_q.shape[1]
    for e, count in enumerate(masked_m.clamp(0, max_m).tolist()):
        if count == 0:
            continue
        y = dequantize_groups(a_q[e, :count], a_s[e, :count]) @ dequantize_blocks(w_q[e], w_s[e]).t()
        d[e, :count] = y.to(d.dtype)
