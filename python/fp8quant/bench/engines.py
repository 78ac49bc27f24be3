"""What inference engines run around DeepGEMM's grouped GEMMs today, for comparison with fp8quant's
MoE layer: the chain of Triton kernels of an engine's DeepGEMM MoE path (vLLM's, at DeepSeek-V3's
shape: H = 7168, E = 256 experts, top-k = 8, intermediate size I = 2048, bf16 activations),
written here from its description as a stand-in for the engines' own code (which fp8quant does
not depend on), and the layer composed of it:

- :func:`engine_quant`: per-token-group quantization of x (groups of 128, fp32 scales in the
  mn_tma layout DeepGEMM reads on SM90).
- :func:`engine_scatter`: the contiguous layout (each expert's rows from a multiple of 128, every
  padding row -1 in ``m_indices`` so that DeepGEMM skips it): a count kernel (atomics), a
  prefix-sum kernel that writes the aligned offsets and every row's ``m_indices``, and a scatter
  kernel where each slot takes a row of its expert by atomic add and copies its token's quantized
  row and scales there. Rows are in no fixed order within an expert; padding rows of the data
  are left as allocated (garbage), as engines leave them.
- :func:`engine_dispatch_masked`: the same for the masked layout ``[E, max_m, H]`` (per-expert
  counts by atomics are ``masked_m``).
- :func:`engine_silu_quant` / :func:`engine_silu_quant_masked`: ``silu(gate) * up`` in float32,
  then per-group quantization; padding rows are skipped (nothing written).
- :func:`engine_gather`: ``out[t] = sum_j w[t, j] * y[row[t, j]]`` in float32, cast to bf16.
- :func:`engine_layer`: quant, dispatch, ``deep_gemm.m_grouped_fp8_gemm_nt_contiguous`` (or
  ``_masked``), SiLU + quant, the second grouped GEMM, gather.

Every function launches kernels only: no device-to-host read, grids from shapes alone, buffers
from ``torch.empty`` / ``torch.zeros``, so the whole layer can be captured in a CUDA graph (after
one warm-up call that compiles the kernels). Without Triton the module still imports; its
functions raise RuntimeError.
"""

from __future__ import annotations

import torch

from .._checks import FP8_DTYPE, check_int
from ..layouts import align, empty_scale

try:
    import triton
    import triton.language as tl
except ImportError:  # CPU-only machines: the module imports, its functions raise RuntimeError
    triton = None
    tl = None

__all__ = [
    "default_max_m",
    "default_max_m_sum",
    "engine_dispatch_masked",
    "engine_gather",
    "engine_layer",
    "engine_quant",
    "engine_scatter",
    "engine_silu_quant",
    "engine_silu_quant_masked",
]

GROUP = 128  # quantization group, and the row alignment of each expert in the contiguous layout
_GROUPS_PER_PROGRAM = 8  # quantization kernels: a [8, 128] tile per program
_COPY_WORDS = 1024  # scatter kernels: int32 words (4 fp8 values) a step
_GATHER_BLOCK = 1024  # gather kernel: elements of a row per program
_COUNT_BLOCK = 1024  # count kernel: slots per program


def _jit(fn):
    """``triton.jit`` where Triton imports; the plain function (never launched) elsewhere."""
    return fn if triton is None else triton.jit(fn)


def _require(*tensors: torch.Tensor) -> None:
    if triton is None:
        raise RuntimeError(
            "fp8quant.bench.engines needs Triton (import triton failed): its functions are the engines' Triton "
            "kernels, run on a CUDA GPU"
        )
    for t in tensors:
        if isinstance(t, torch.Tensor) and not t.is_cuda:
            raise RuntimeError(f"fp8quant.bench.engines runs Triton kernels on CUDA tensors, got one on {t.device}")


def default_max_m_sum(t: int, k: int, num_experts: int) -> int:
    """Rows of the contiguous layout that always suffice: every slot, plus at most 127 padding rows
    for each expert that gets any (at most ``min(t * k, E)`` of them), rounded up to 128."""
    return align(t * k + min(t * k, num_experts) * (GROUP - 1), GROUP)


def default_max_m(t: int) -> int:
    """Rows per expert of the masked layout: T (a token reaches an expert at most once), rounded
    up to a multiple of 128: DeepGEMM's masked GEMM stores whole 64- or 128-row tiles, so with
    fewer rows per expert a tile's store runs into the next expert's rows."""
    return align(max(t, 1), 128)


# --- kernels -------------------------------------------------------------------------------------


@_jit
def _quant_tile(x):
    """A [P, 128] float32 tile quantized group by group (a group a row): amax over the finite
    values, at least 1e-10; ``s = amax / 448`` (IEEE division, as the reference); ``q = clamp(x / s,
    -448, 448)`` (Triton's ``/``, an approximate division as in the engines' kernels) cast to
    float8_e4m3fn (round to nearest even). Returns ``(q, s)``."""
    ax = tl.abs(x)
    finite = ax <= 3.4028234663852886e38  # false for inf and NaN
    amax = tl.max(tl.where(finite, ax, 0.0), axis=1)
    amax = tl.maximum(amax, 1e-10)
    s = tl.div_rn(amax, 448.0)
    q = tl.clamp(x / s[:, None], -448.0, 448.0).to(tl.float8e4nv)
    return q, s


@_jit
def _quant_kernel(
    x_ptr, q_ptr, s_ptr, num_groups, x_row_stride, q_row_stride, s_row_stride, s_group_stride,
    GPP: tl.constexpr, GROUP_SIZE: tl.constexpr,
):  # fmt: skip
    """Program (row, j): groups j * GPP .. j * GPP + GPP - 1 of one row."""
    row = tl.program_id(0).to(tl.int64)
    g = tl.program_id(1) * GPP + tl.arange(0, GPP)
    col = tl.arange(0, GROUP_SIZE)
    offs = g[:, None] * GROUP_SIZE + col[None, :]
    mask = (g[:, None] < num_groups) & (col[None, :] < GROUP_SIZE)
    x = tl.load(x_ptr + row * x_row_stride + offs, mask=mask, other=0.0).to(tl.float32)
    q, s = _quant_tile(x)
    tl.store(q_ptr + row * q_row_stride + offs, q, mask=mask)
    tl.store(s_ptr + row * s_row_stride + g * s_group_stride, s, mask=g < num_groups)


@_jit
def _count_kernel(ids_ptr, counts_ptr, num_slots, num_experts, BLOCK: tl.constexpr):
    """counts[e] += 1 for each slot routed to expert e (ids outside [0, E) are dropped)."""
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    ids = tl.load(ids_ptr + offs, mask=offs < num_slots, other=-1)
    valid = (ids >= 0) & (ids < num_experts)
    tl.atomic_add(counts_ptr + ids, 1, mask=valid)


@_jit
def _offsets_kernel(
    counts_ptr, cursor_ptr, m_indices_ptr, num_experts, num_rows,
    ALIGN: tl.constexpr, BLOCK_E: tl.constexpr, BLOCK_R: tl.constexpr,
):  # fmt: skip
    """Each program rebuilds the aligned offsets from the counts (an exclusive prefix sum of
    ``ceil(count / ALIGN) * ALIGN``); program 0 stores them as the experts' row cursors. Then for its
    BLOCK_R rows: the expert whose segment holds the row, ``m_indices`` = that expert on the first
    ``count`` rows of the segment, -1 on its padding and on every row past the last segment."""
    e = tl.arange(0, BLOCK_E)
    counts = tl.load(counts_ptr + e, mask=e < num_experts, other=0)
    aligned = (counts + ALIGN - 1) // ALIGN * ALIGN
    ends = tl.cumsum(aligned, axis=0)
    if tl.program_id(0) == 0:
        tl.store(cursor_ptr + e, ends - aligned, mask=e < num_experts)
    rows = tl.program_id(0) * BLOCK_R + tl.arange(0, BLOCK_R)
    before = ends[None, :] <= rows[:, None]  # segments that end at or before each row
    expert = tl.sum(before.to(tl.int32), axis=1)
    start = tl.sum(tl.where(before, aligned[None, :], 0), axis=1)
    count = tl.load(counts_ptr + expert, mask=expert < num_experts, other=0)
    m = tl.where(rows - start < count, expert, -1)
    tl.store(m_indices_ptr + rows, m, mask=rows < num_rows)


@_jit
def _scatter_kernel(
    ids_ptr, q_ptr, s_ptr, cursor_ptr, aq_ptr, as_ptr, rows_ptr,
    top_k, num_experts, limit, words, num_groups,
    q_row_stride, s_row_stride, s_group_stride, aq_row_stride, as_batch_stride, as_row_stride, as_group_stride,
    MASKED: tl.constexpr, BLOCK_W: tl.constexpr, BLOCK_G: tl.constexpr,
):  # fmt: skip
    """Program s: slot s = t * k + j. Its expert's cursor, advanced by atomic add, gives its rank
    (masked: row ``e * limit + rank`` of ``[E, limit, H]``) or its row (contiguous: the cursor
    starts at the expert's offset); a slot at or past ``limit`` (max_m, or max_m_sum) or with an id
    outside [0, E) gets row -1 and copies nothing. Otherwise token t's quantized row (int32 words)
    and its scales are copied there."""
    slot = tl.program_id(0)
    token = (slot // top_k).to(tl.int64)
    expert = tl.load(ids_ptr + slot).to(tl.int32)
    valid = (expert >= 0) & (expert < num_experts)
    pos = tl.atomic_add(cursor_ptr + expert, 1, mask=valid)
    keep = valid & (pos < limit)
    if MASKED:
        row = expert * limit + pos
        s_dst = as_ptr + expert.to(tl.int64) * as_batch_stride + pos.to(tl.int64) * as_row_stride
    else:
        row = pos
        s_dst = as_ptr + pos.to(tl.int64) * as_row_stride
    tl.store(rows_ptr + slot, tl.where(keep, row, -1))
    src = q_ptr + token * q_row_stride
    dst = aq_ptr + row.to(tl.int64) * aq_row_stride
    for w0 in range(0, words, BLOCK_W):
        w = w0 + tl.arange(0, BLOCK_W)
        m = keep & (w < words)
        tl.store(dst + w, tl.load(src + w, mask=m), mask=m)
    g = tl.arange(0, BLOCK_G)
    gm = keep & (g < num_groups)
    scales = tl.load(s_ptr + token * s_row_stride + g * s_group_stride, mask=gm)
    tl.store(s_dst + g * as_group_stride, scales, mask=gm)


@_jit
def _silu_quant_kernel(
    y_ptr, q_ptr, s_ptr, live_ptr, rows, inter, num_groups,
    y_batch_stride, y_row_stride, q_batch_stride, q_row_stride, s_batch_stride, s_row_stride, s_group_stride,
    LIVE: tl.constexpr, GPP: tl.constexpr, GROUP_SIZE: tl.constexpr,
):  # fmt: skip
    """Program (b * rows + r, j): groups j * GPP .. of row r of batch b; ``silu(gate) * up`` in
    float32 (gate the first ``inter`` columns), quantized. LIVE 0: every row; 1: rows whose
    ``m_indices`` is >= 0; 2: rows below ``masked_m[b]``. A dead row loads and stores nothing."""
    pid = tl.program_id(0)
    batch = (pid // rows).to(tl.int64)
    row = (pid % rows).to(tl.int64)
    if LIVE == 1:
        live = tl.load(live_ptr + pid) >= 0
    elif LIVE == 2:
        live = row < tl.load(live_ptr + batch)
    else:
        live = pid >= 0
    g = tl.program_id(1) * GPP + tl.arange(0, GPP)
    col = tl.arange(0, GROUP_SIZE)
    offs = g[:, None] * GROUP_SIZE + col[None, :]
    mask = live & (g[:, None] < num_groups) & (col[None, :] < GROUP_SIZE)
    src = y_ptr + batch * y_batch_stride + row * y_row_stride
    gate = tl.load(src + offs, mask=mask, other=0.0).to(tl.float32)
    up = tl.load(src + inter + offs, mask=mask, other=0.0).to(tl.float32)
    act = gate / (1.0 + tl.exp(-gate)) * up
    q, s = _quant_tile(act)
    tl.store(q_ptr + batch * q_batch_stride + row * q_row_stride + offs, q, mask=mask)
    s_dst = s_ptr + batch * s_batch_stride + row * s_row_stride + g * s_group_stride
    tl.store(s_dst, s, mask=live & (g < num_groups))


@_jit
def _gather_kernel(
    y_ptr, rows_ptr, w_ptr, out_ptr, top_k, num_rows, hidden, y_row_stride, out_row_stride, BLOCK: tl.constexpr
):
    """Program (t, j): columns j * BLOCK .. of token t, the weighted sum over its k slots in
    float32 (slots whose row is outside [0, num_rows) skipped), cast to out's dtype."""
    t = tl.program_id(0)
    offs = tl.program_id(1) * BLOCK + tl.arange(0, BLOCK)
    in_row = offs < hidden
    acc = tl.zeros([BLOCK], dtype=tl.float32)
    for j in range(top_k):
        r = tl.load(rows_ptr + t * top_k + j)
        w = tl.load(w_ptr + t * top_k + j)
        ok = (r >= 0) & (r < num_rows)
        v = tl.load(y_ptr + r.to(tl.int64) * y_row_stride + offs, mask=in_row & ok, other=0.0)
        acc += w * v.to(tl.float32)
    tl.store(out_ptr + t.to(tl.int64) * out_row_stride + offs, acc.to(out_ptr.dtype.element_ty), mask=in_row)


# --- wrappers ------------------------------------------------------------------------------------


def _check_rows(x: torch.Tensor, name: str, dims: int) -> None:
    if not isinstance(x, torch.Tensor) or x.dim() != dims:
        raise ValueError(f"{name} must be a {dims}-D tensor, got {type(x).__name__} {getattr(x, 'shape', '')}")
    if x.shape[-1] % GROUP or (x.numel() and x.stride(-1) != 1):
        raise ValueError(f"{name} must have a contiguous last dimension, a multiple of {GROUP}; got shape "
                         f"{tuple(x.shape)}, strides {tuple(x.stride())}")  # fmt: skip


def _check_topk(topk_ids: torch.Tensor) -> None:
    if topk_ids.dtype not in (torch.int32, torch.int64) or topk_ids.dim() != 2 or not topk_ids.is_contiguous():
        raise ValueError("topk_ids must be a contiguous int32 (or int64) tensor [T, k]")


def engine_quant(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Per-token-group quantization of ``x [T, H]`` (bf16; fp16 and fp32 work too) in groups of 128:
    ``q`` float8_e4m3fn ``[T, H]`` and ``s`` float32 ``[T, H / 128]`` with strides
    ``(1, align(T, 4))`` (mn_tma). One program per row and 8 groups."""
    _require(x)
    _check_rows(x, "x", 2)
    t, h = x.shape
    g = h // GROUP
    q = torch.empty((t, h), dtype=FP8_DTYPE, device=x.device)
    s = empty_scale("mn_tma", t, g, device=x.device)
    if t:
        grid = (t, triton.cdiv(g, _GROUPS_PER_PROGRAM))
        _quant_kernel[grid](
            x, q, s, g, x.stride(0), q.stride(0), s.stride(0), s.stride(1),
            GPP=_GROUPS_PER_PROGRAM, GROUP_SIZE=GROUP, num_warps=4,
        )  # fmt: skip
    return q, s


def _dispatch(
    q: torch.Tensor, s: torch.Tensor, topk_ids: torch.Tensor, num_experts: int, masked: bool, rows: int
) -> tuple[torch.Tensor, ...]:
    """Both layouts' dispatch. Contiguous: counts by atomics, offsets and m_indices, then the
    scatter (cursors from the offsets). Masked: the scatter alone, its cursors the counts (zeroed).
    ``rows``: max_m_sum (contiguous) or max_m (masked)."""
    _require(q, s, topk_ids)
    _check_rows(q, "q", 2)
    _check_topk(topk_ids)
    if q.dtype != FP8_DTYPE:
        raise ValueError(f"q must be float8_e4m3fn, got {q.dtype}")
    t, h = q.shape
    g = h // GROUP
    if s.dtype != torch.float32 or tuple(s.shape) != (t, g):
        raise ValueError(f"s must be float32 [{t}, {g}] (engine_quant's scales), got {s.dtype} {tuple(s.shape)}")
    if topk_ids.shape[0] != t or topk_ids.device != q.device or s.device != q.device:
        raise ValueError(f"topk_ids must be [{t}, k] on {q.device}, got {tuple(topk_ids.shape)} on {topk_ids.device}")
    check_int(num_experts, "num_experts")
    if isinstance(rows, bool) or not isinstance(rows, int) or rows < (1 if masked else 0):
        raise ValueError(f"{'max_m' if masked else 'max_m_sum'} must be a positive int, got {rows!r}")
    k = topk_ids.shape[1]
    e = num_experts
    device = q.device
    counts = torch.zeros(e, dtype=torch.int32, device=device)
    if masked:
        a_q = torch.empty((e, rows, h), dtype=FP8_DTYPE, device=device)
        a_s = empty_scale("mn_tma", rows, g, (e,), device=device)
        as_strides = a_s.stride()
    else:
        a_q = torch.empty((rows, h), dtype=FP8_DTYPE, device=device)
        a_s = empty_scale("mn_tma", rows, g, device=device)
        as_strides = (0, *a_s.stride())
    out_rows = torch.empty((t, k), dtype=torch.int32, device=device)
    slots = t * k
    if masked:
        cursor = counts  # the scatter's atomic adds hand out the ranks and leave masked_m = counts
        m_indices = None
    else:
        if slots:
            grid = (triton.cdiv(slots, _COUNT_BLOCK),)
            _count_kernel[grid](topk_ids, counts, slots, e, BLOCK=_COUNT_BLOCK, num_warps=4)
        cursor = torch.empty(e, dtype=torch.int32, device=device)
        m_indices = torch.empty(rows, dtype=torch.int32, device=device)
        block_e = triton.next_power_of_2(e)
        block_r = max(16, 8192 // block_e)
        # One program always runs: it writes the cursors even when there are no rows
        _offsets_kernel[(max(1, triton.cdiv(rows, block_r)),)](
            counts, cursor, m_indices, e, rows, ALIGN=GROUP, BLOCK_E=block_e, BLOCK_R=block_r, num_warps=4
        )
    if slots:
        words = h // 4
        q_words, aq_words = q.view(torch.int32), a_q.view(torch.int32)
        _scatter_kernel[(slots,)](
            topk_ids, q_words, s, cursor, aq_words, a_s, out_rows,
            k, e, rows, words, g,
            q_words.stride(0), s.stride(0), s.stride(1), words, *as_strides,
            MASKED=masked, BLOCK_W=min(_COPY_WORDS, triton.next_power_of_2(words)),
            BLOCK_G=triton.next_power_of_2(g), num_warps=4,
        )  # fmt: skip
    if masked:
        if rows < t:  # a bound below T can be exceeded: DeepGEMM must not read past max_m rows
            counts.clamp_(max=rows)
        return a_q, a_s, counts, out_rows
    return a_q, a_s, m_indices, out_rows


def engine_scatter(
    q: torch.Tensor, s: torch.Tensor, topk_ids: torch.Tensor, num_experts: int, max_m_sum: int
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """The contiguous layout of quantized tokens ``q [T, H]``, ``s [T, H / 128]`` (any strides)
    routed by ``topk_ids [T, k]`` (int32; ids outside ``[0, num_experts)`` drop the slot).

    Returns ``(a_q, a_s, m_indices, inv_perm)``: ``a_q`` float8_e4m3fn ``[max_m_sum, H]``, ``a_s``
    float32 ``[max_m_sum, H / 128]`` strides ``(1, align(max_m_sum, 4))``, ``m_indices`` int32
    ``[max_m_sum]`` (each expert's first ``count`` rows from its 128-aligned offset; -1 on every
    other row), ``inv_perm`` int32 ``[T, k]`` (the row of each slot; -1 for a dropped slot, or one
    past ``max_m_sum``, which :func:`default_max_m_sum` makes impossible). The rows of an expert
    are taken by atomic add, so which slot lands on which row varies from run to run; rows
    without a token keep what ``torch.empty`` gave."""
    return _dispatch(q, s, topk_ids, num_experts, False, max_m_sum)


def engine_dispatch_masked(
    q: torch.Tensor, s: torch.Tensor, topk_ids: torch.Tensor, num_experts: int, max_m: int
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """The masked layout of quantized tokens (as :func:`engine_scatter`'s): returns ``(a_q, a_s,
    masked_m, masked_row)``: ``a_q`` ``[E, max_m, H]``, ``a_s`` float32 ``[E, max_m, H / 128]``
    strides ``(Ma * G, 1, Ma)`` for ``Ma = align(max_m, 4)``, ``masked_m`` int32 ``[E]`` (slots of
    each expert, from atomics), ``masked_row`` int32 ``[T, k]`` (``e * max_m + rank``, -1 for a
    dropped slot or a rank past ``max_m``)."""
    return _dispatch(q, s, topk_ids, num_experts, True, max_m)


def _silu(y: torch.Tensor, live: torch.Tensor | None, mode: int) -> tuple[torch.Tensor, torch.Tensor]:
    """mode 0: ``y [M, 2I]``, every row; 1: with m_indices; 2: ``y [E, max_m, 2I]`` with masked_m."""
    _require(y)
    batched = mode == 2
    if not isinstance(y, torch.Tensor) or y.dim() != 2 + batched or y.shape[-1] % (2 * GROUP):
        raise ValueError(f"y must be [{'E, max_m' if batched else 'M'}, 2I] with I a multiple of {GROUP}, "
                         f"got {tuple(y.shape)}")  # fmt: skip
    if y.numel() and y.stride(-1) != 1:
        raise ValueError(f"y must have a contiguous last dimension, got strides {tuple(y.stride())}")
    inter = y.shape[-1] // 2
    g = inter // GROUP
    batch, rows = (y.shape[0], y.shape[1]) if batched else (1, y.shape[0])
    if mode:
        want = (batch,) if batched else (rows,)
        if (
            not isinstance(live, torch.Tensor)
            or live.dtype != torch.int32
            or tuple(live.shape) != want
            or not live.is_contiguous()
            or live.device != y.device
        ):
            name = "masked_m" if batched else "m_indices"
            raise ValueError(f"{name} must be a contiguous int32 tensor {list(want)} on {y.device}")
    q = torch.empty((*y.shape[:-1], inter), dtype=FP8_DTYPE, device=y.device)
    s = empty_scale("mn_tma", rows, g, (batch,) if batched else (), device=y.device)
    if batch * rows:
        ys, qs, ss = y.stride(), q.stride(), s.stride()
        if not batched:
            ys, qs, ss = (0, *ys), (0, *qs), (0, *ss)
        grid = (batch * rows, triton.cdiv(g, _GROUPS_PER_PROGRAM))
        _silu_quant_kernel[grid](
            y, q, s, y if live is None else live, rows, inter, g, *ys[:2], *qs[:2], *ss,
            LIVE=mode, GPP=_GROUPS_PER_PROGRAM, GROUP_SIZE=GROUP, num_warps=4,
        )  # fmt: skip
    return q, s


def engine_silu_quant(y: torch.Tensor, m_indices: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """``silu(gate) * up`` of ``y [M, 2I]`` (gate the first half of each row) in float32, quantized
    per group of 128: ``q`` float8_e4m3fn ``[M, I]``, ``s`` float32 ``[M, I / 128]`` strides
    ``(1, align(M, 4))``. With ``m_indices`` (int32 ``[M]``), rows whose entry is -1 are skipped:
    nothing of them is read or written."""
    return _silu(y, m_indices, 0 if m_indices is None else 1)


def engine_silu_quant_masked(y: torch.Tensor, masked_m: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """:func:`engine_silu_quant` on the masked layout ``y [E, max_m, 2I]``: ``q [E, max_m, I]``,
    ``s [E, max_m, I / 128]`` strides ``(Ma * G, 1, Ma)`` (``Ma = align(max_m, 4)``); rows at or
    past ``masked_m[e]`` are skipped."""
    return _silu(y, masked_m, 2)


def engine_gather(y: torch.Tensor, inv_perm: torch.Tensor, topk_weights: torch.Tensor) -> torch.Tensor:
    """``out[t] = sum_j topk_weights[t, j] * y[inv_perm[t, j]]`` in float32 (rows -1 skipped), in
    y's dtype: ``y`` ``[R, H]`` (contiguous layout) or ``[E, max_m, H]`` (masked, rows
    ``e * max_m + rank``, evenly spaced), last dimension contiguous."""
    _require(y, inv_perm, topk_weights)
    if y.dim() == 3:
        if y.shape[0] > 1 and y.shape[1] and y.stride(0) != y.shape[1] * y.stride(1):
            raise ValueError(f"y [E, max_m, H] must have evenly spaced rows, got strides {tuple(y.stride())}")
        y_rows, row_stride = y.shape[0] * y.shape[1], y.stride(1)
    elif y.dim() == 2:
        y_rows, row_stride = y.shape[0], y.stride(0)
    else:
        raise ValueError(f"y must be [R, H] or [E, max_m, H], got {tuple(y.shape)}")
    if y.numel() and y.stride(-1) != 1:
        raise ValueError(f"y must have a contiguous last dimension, got strides {tuple(y.stride())}")
    if inv_perm.dtype != torch.int32 or inv_perm.dim() != 2 or not inv_perm.is_contiguous():
        raise ValueError("inv_perm must be a contiguous int32 tensor [T, k]")
    if topk_weights.dtype != torch.float32 or topk_weights.shape != inv_perm.shape or not topk_weights.is_contiguous():
        raise ValueError(f"topk_weights must be a contiguous float32 tensor {list(inv_perm.shape)}")
    t, k = inv_perm.shape
    h = y.shape[-1]
    out = torch.empty((t, h), dtype=y.dtype, device=y.device)
    if t and h:
        _gather_kernel[(t, triton.cdiv(h, _GATHER_BLOCK))](
            y, inv_perm, topk_weights, out, k, y_rows, h, row_stride, out.stride(0), BLOCK=_GATHER_BLOCK, num_warps=4
        )
    return out


def _check_weight(w, name: str, e: int | None, n: int, k: int) -> int:
    """``w.q`` float8_e4m3fn [E, n, k] contiguous, ``w.scale`` float32 [E, ceil(n/128), ceil(k/128)]."""
    q, scale = getattr(w, "q", None), getattr(w, "scale", None)
    if not isinstance(q, torch.Tensor) or q.dtype != FP8_DTYPE or q.dim() != 3 or not q.is_contiguous():
        raise ValueError(f"{name}.q must be a contiguous float8_e4m3fn tensor [E, N, K]")
    if (e is not None and q.shape[0] != e) or tuple(q.shape[1:]) != (n, k):
        raise ValueError(f"{name}.q must be [{e or 'E'}, {n}, {k}], got {tuple(q.shape)}")
    want = (q.shape[0], -(-n // GROUP), -(-k // GROUP))
    if not isinstance(scale, torch.Tensor) or scale.dtype != torch.float32 or tuple(scale.shape) != want:
        raise ValueError(f"{name}.scale must be float32 {list(want)}")
    return q.shape[0]


def engine_layer(
    x: torch.Tensor,
    topk_ids: torch.Tensor,
    topk_weights: torch.Tensor,
    w13,
    w2,
    *,
    layout: str = "contiguous",
    max_m_sum: int | None = None,
    max_m: int | None = None,
) -> torch.Tensor:
    """The MoE layer as engines run it with DeepGEMM: ``x [T, H]`` bf16, ``topk_ids [T, k]`` int32,
    ``topk_weights [T, k]`` float32; ``w13`` (gate and up, ``q [E, 2I, H]``) and ``w2``
    (``q [E, H, I]``) objects with ``.q`` float8_e4m3fn and ``.scale`` float32 128 x 128 block
    scales (contiguous). Returns ``out [T, H]`` bf16.

    ``layout="contiguous"``: engine_quant, engine_scatter (``max_m_sum`` rows, default
    :func:`default_max_m_sum`, a multiple of 128), ``m_grouped_fp8_gemm_nt_contiguous``,
    engine_silu_quant, the second contiguous GEMM, engine_gather. ``layout="masked"``:
    engine_quant, engine_dispatch_masked (``max_m`` rows per expert, default
    :func:`default_max_m`), ``m_grouped_fp8_gemm_nt_masked`` with ``expected_m = max(1, T * k // E)``,
    engine_silu_quant_masked, the second masked GEMM, engine_gather over the masked rows.

    Needs Triton and DeepGEMM (imported here)."""
    if layout not in ("contiguous", "masked"):
        raise ValueError(f"layout must be 'contiguous' or 'masked', got {layout!r}")
    _require(x, topk_ids, topk_weights)
    _check_rows(x, "x", 2)
    _check_topk(topk_ids)
    t, h = x.shape
    if x.dtype != torch.bfloat16:
        raise ValueError(f"x must be bfloat16 (DeepGEMM writes bf16 outputs), got {x.dtype}")
    if topk_ids.shape[0] != t or topk_weights.shape != topk_ids.shape or topk_weights.dtype != torch.float32:
        raise ValueError(f"topk_ids and topk_weights (float32) must both be [{t}, k], got {tuple(topk_ids.shape)} "
                         f"and {topk_weights.dtype} {tuple(topk_weights.shape)}")  # fmt: skip
    w13_q = getattr(w13, "q", None)
    if not isinstance(w13_q, torch.Tensor) or w13_q.dim() != 3 or w13_q.shape[1] % (2 * GROUP):
        raise ValueError(f"w13.q must be [E, 2I, H] with I a multiple of {GROUP}")
    inter = w13_q.shape[1] // 2
    e = _check_weight(w13, "w13", None, 2 * inter, h)
    _check_weight(w2, "w2", e, h, inter)
    k = topk_ids.shape[1]
    if max_m_sum is None:
        max_m_sum = default_max_m_sum(t, k, e)
    if max_m is None:
        max_m = default_max_m(t)
    if isinstance(max_m_sum, bool) or not isinstance(max_m_sum, int) or max_m_sum < 0 or max_m_sum % GROUP:
        raise ValueError(f"max_m_sum must be a multiple of {GROUP}, got {max_m_sum!r}")
    if isinstance(max_m, bool) or not isinstance(max_m, int) or max_m < 1:
        raise ValueError(f"max_m must be a positive int, got {max_m!r}")
    import deep_gemm  # noqa: PLC0415 - optional, needed here only

    device = x.device
    if t == 0:
        return torch.empty((0, h), dtype=x.dtype, device=device)
    q, s = engine_quant(x)
    if layout == "contiguous":
        a_q, a_s, m_indices, rows = engine_scatter(q, s, topk_ids, e, max_m_sum)
        y1 = torch.empty((max_m_sum, 2 * inter), dtype=torch.bfloat16, device=device)
        deep_gemm.m_grouped_fp8_gemm_nt_contiguous((a_q, a_s), (w13.q, w13.scale), y1, m_indices)
        q2, s2 = engine_silu_quant(y1, m_indices)
        y2 = torch.empty((max_m_sum, h), dtype=torch.bfloat16, device=device)
        deep_gemm.m_grouped_fp8_gemm_nt_contiguous((q2, s2), (w2.q, w2.scale), y2, m_indices)
    else:
        a_q, a_s, masked_m, rows = engine_dispatch_masked(q, s, topk_ids, e, max_m)
        expected_m = max(1, t * k // e)
        y1 = torch.empty((e, max_m, 2 * inter), dtype=torch.bfloat16, device=device)
        deep_gemm.m_grouped_fp8_gemm_nt_masked((a_q, a_s), (w13.q, w13.scale), y1, masked_m, expected_m)
        q2, s2 = engine_silu_quant_masked(y1, masked_m)
        y2 = torch.empty((e, max_m, h), dtype=torch.bfloat16, device=device)
        deep_gemm.m_grouped_fp8_gemm_nt_masked((q2, s2), (w2.q, w2.scale), y2, masked_m, expected_m)
    return engine_gather(y2, rows, topk_weights.contiguous())
