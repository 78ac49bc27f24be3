"""A whole MoE layer on fp8quant's ops: routing, dispatch + quantize, grouped FP8 GEMM, SiLU-and-mul +
quantize, grouped FP8 GEMM, weighted combine; the layout chosen for the batch size.

    w13 = fp8quant.prepare_experts(gate_up_proj)     # bf16 [E, 2I, H] -> FP8, 128 x 128 block scales
    w2 = fp8quant.prepare_experts(down_proj)         # bf16 [E, H, I]
    out = fp8quant.moe_layer(x, topk_ids, topk_weights, w13, w2)   # x bf16 [T, H] -> [T, H]

    layer = fp8quant.MoELayer(w13, w2)               # the same as an nn.Module
    out = layer(x, topk_ids, topk_weights)

**Layouts.** ``"contiguous"``: each expert's rows one after another, every expert padded to 128
rows for DeepGEMM (``m_grouped_fp8_gemm_nt_contiguous``, whose 128-row tiles at small T are
mostly padding) and to the Triton GEMM's tile height (16 rows at decode sizes) for it
(:func:`segment_align`). ``"masked"``: ``[E, max_m, H]``, one block of rows per
expert, the rows in use given by the per-expert counts (``m_grouped_fp8_gemm_nt_masked``).
``layout="auto"`` picks by T from :data:`LAYOUT_BY_TOKENS` (from the layer benchmark, BENCHMARKS.md).
The small-T form is fp8quant's Triton GEMM on segments of its own 16-row tiles (:data:`AUTO_PLAN`):
its cost follows the active experts, and the GEMM streams their weights near the copy bandwidth.

**Backends.** ``"deep_gemm"`` (DeepGEMM's grouped GEMMs, SM90), ``"triton"`` (fp8quant's own
grouped block-FP8 GEMM, :mod:`fp8quant.grouped_gemm`, which reads the same layouts) and
``"reference"`` (dequantize and multiply in float32 per expert; any device, the CPU path).
``backend="auto"`` follows :data:`AUTO_PLAN` per T when DeepGEMM imports on SM90 (Triton at
decode sizes, DeepGEMM at prefill), else Triton on a GPU, else the reference.

**Static bounds.** Every buffer is sized from T, k and E alone (:func:`fp8quant.moe_bounds`), and
nothing is read back from the device: a call can be captured in a CUDA graph for a fixed T and
replayed on any routing of T tokens (the DeepGEMM and Triton backends; the reference backend
synchronizes). The contiguous layout holds any ids; the masked layout holds T slots per expert,
which top-k ids distinct per token (what ``torch.topk`` gives) never exceed: with repeated ids,
the slots past T of one expert are dropped. Use ``layout="contiguous"`` for such routings.
"""

from __future__ import annotations

import warnings
from typing import NamedTuple

import torch

from . import grouped_gemm, reference
from ._checks import FP8_DTYPE, check_int, check_scale_tensor
from .gemm import _have_deep_gemm, _import_deep_gemm
from .moe import moe_bounds, moe_combine, moe_dispatch_quant, moe_routing, silu_mul_quant
from .routing import MoeRouting
from .weights import per_block_quant

__all__ = [
    "AUTO_PLAN", "LAYOUT_BY_TOKENS", "ExpertWeights", "MoELayer", "check_expert_weights", "choose_layout", "expert_ffn",
    "moe_layer", "plan", "prepare_experts", "segment_align",
]  # fmt: skip

#: Rows each expert's segment is padded to in the contiguous layout (DeepGEMM SM90's M tile).
ALIGN = 128
#: DeepGEMM's masked GEMM stores whole row tiles (64 or 128 rows): with fewer rows per expert
#: than a tile, the store of one expert's tile lands on the next expert's rows
#: (docs/benchmarks-history.md, eleventh run). Its masked layout therefore gets T rounded up to this many rows per expert;
#: only the rows holding tokens are written or computed, so the cost is memory, not time.
DEEP_GEMM_MASKED_ROWS = 128

#: What ``backend="auto"`` runs for T tokens when DeepGEMM imports: the first ``(largest T,
#: backend, layout)`` entry that holds T. From the layer benchmark (DeepSeek-V3 shape,
#: BENCHMARKS.md): fp8quant's Triton GEMM streams the active experts' weights faster than
#: DeepGEMM's grouped GEMMs at decode sizes, on its contiguous layout (segments of 16-row tiles)
#: except at T = 2-4, where the masked one is taken (faster at T = 4; measured at T = 1, 4 and
#: 16 only); DeepGEMM's masked GEMM wins at T = 512 and its contiguous GEMM at prefill.
AUTO_PLAN: tuple[tuple[float, str, str], ...] = (
    (1, "triton", "contiguous"),
    (4, "triton", "masked"),
    (128, "triton", "contiguous"),
    (512, "deep_gemm", "masked"),
    (1024, "triton", "contiguous"),
    (float("inf"), "deep_gemm", "contiguous"),
)

#: The layout ``layout="auto"`` takes for T tokens on a chosen backend: the first ``(largest T,
#: layout)`` entry that holds T (the same benchmark).
LAYOUT_BY_TOKENS: dict[str, tuple[tuple[float, str], ...]] = {
    "deep_gemm": ((1, "contiguous"), (1024, "masked"), (float("inf"), "contiguous")),
    "triton": ((1, "contiguous"), (4, "masked"), (float("inf"), "contiguous")),
    "reference": ((float("inf"), "contiguous"),),
}

_BACKENDS = ("auto", "deep_gemm", "triton", "reference")
_LAYOUTS = ("auto", "contiguous", "masked")


class ExpertWeights(NamedTuple):
    """One projection of every expert, quantized for the grouped GEMMs (:func:`prepare_experts`):
    ``q`` float8_e4m3fn ``[E, N, K]`` contiguous, ``scale`` float32 ``[E, ceil(N/128),
    ceil(K/128)]`` contiguous, one scale per 128 x 128 block (DeepSeek-V3's ``weight_scale_inv``)."""

    q: torch.Tensor
    scale: torch.Tensor

    @property
    def shape(self) -> tuple[int, int, int]:
        return tuple(self.q.shape)


def prepare_experts(
    w: torch.Tensor, w_scale: torch.Tensor | None = None, *, scale: torch.Tensor | None = None
) -> ExpertWeights:
    """Expert weights ``[E, N, K]`` for :func:`moe_layer`: bf16/fp16/fp32 weights are quantized in
    128 x 128 blocks (:func:`fp8quant.per_block_quant`); a checkpoint's float8_e4m3fn weight comes
    with its ``w_scale`` (``weight_scale_inv``, ``[E, ceil(N/128), ceil(K/128)]``) and is checked
    and kept as it is. K must be a multiple of 128 (the GEMMs' K blocks). ``scale`` is
    ``w_scale``'s deprecated name (docs/contract.md, "Names"), kept for one release."""
    if scale is not None:
        warnings.warn(
            "prepare_experts(scale=...) is deprecated: pass w_scale, the name of a weight's block scales "
            "everywhere (docs/contract.md, 'Names'); scale will be removed in the next release",
            DeprecationWarning,
            stacklevel=2,
        )
        if w_scale is not None:
            raise TypeError("pass w_scale only: scale is its deprecated name")
        w_scale = scale
    if not isinstance(w, torch.Tensor) or w.dim() != 3:
        raise TypeError("w must be a tensor [E, N, K]")
    e, n, k = w.shape
    if e < 1 or n < 1 or k < 1 or k % 128:
        raise ValueError(f"w must be [E, N, K] with E, N >= 1 and K a positive multiple of 128, got {tuple(w.shape)}")
    want = (e, -(-n // 128), k // 128)
    if w.dtype == FP8_DTYPE:
        if not isinstance(w_scale, torch.Tensor) or w_scale.dtype != torch.float32 or tuple(w_scale.shape) != want:
            raise ValueError(f"a float8_e4m3fn w needs its block scales w_scale: float32 {want}")
        if w_scale.device != w.device:
            raise ValueError(f"w_scale is on {w_scale.device}, w on {w.device}")
        return ExpertWeights(w.contiguous(), w_scale.contiguous())
    if w_scale is not None:
        raise ValueError("w_scale goes with a float8_e4m3fn w only (other dtypes are quantized here)")
    q, s = per_block_quant(w.contiguous())
    return ExpertWeights(q, s)


def _deep_gemm():
    """DeepGEMM's module when ``import deep_gemm`` succeeds, else None: one import per process,
    shared with :func:`fp8quant.linear` (an installed package that fails to import warns once)."""
    return _import_deep_gemm()[0] if _have_deep_gemm() else None


def _resolve_backend(backend: str, x: torch.Tensor) -> str:
    if backend not in _BACKENDS:
        raise ValueError(f"backend must be one of {_BACKENDS}, got {backend!r}")
    if not x.is_cuda:
        if backend not in ("auto", "reference"):
            raise ValueError(f"backend={backend!r} needs CUDA tensors; x is on {x.device}")
        return "reference"
    arch = torch.cuda.get_device_capability(x.device)[0]
    if backend == "deep_gemm":
        if arch != 9:
            raise ValueError(f"backend='deep_gemm' runs the grouped GEMMs on SM90 here; this GPU is sm_{arch}x")
        if _deep_gemm() is None:
            error = _import_deep_gemm()[1]
            raise RuntimeError(f"backend='deep_gemm' needs the deep_gemm package, which does not import: {error!r}")
    if backend == "triton" and not grouped_gemm.available():
        raise RuntimeError("backend='triton' needs Triton, which does not import")
    if backend != "auto":
        return backend
    deep_gemm, triton = arch == 9 and _deep_gemm() is not None, grouped_gemm.available()
    if deep_gemm and triton:
        return "auto"  # AUTO_PLAN picks per T
    return "deep_gemm" if deep_gemm else "triton" if triton else "reference"


def choose_layout(tokens: int, backend: str) -> str:
    """The layout ``layout="auto"`` takes for ``tokens`` tokens on ``backend``
    (:data:`LAYOUT_BY_TOKENS`)."""
    return next(layout for bound, layout in LAYOUT_BY_TOKENS[backend] if tokens <= bound)


def plan(tokens: int, backend: str = "auto", layout: str = "auto") -> tuple[str, str]:
    """The ``(backend, layout)`` the layer runs for ``tokens`` tokens: ``backend="auto"`` (with
    DeepGEMM present) takes the backend of :data:`AUTO_PLAN`'s entry for T, and its layout unless
    one is given; a chosen backend takes its layout from :data:`LAYOUT_BY_TOKENS`."""
    if backend == "auto":
        backend, auto_layout = next((b, lay) for bound, b, lay in AUTO_PLAN if tokens <= bound)
    else:
        auto_layout = choose_layout(tokens, backend)
    return backend, auto_layout if layout == "auto" else layout


def segment_align(backend: str, layout: str, expected_m: int) -> int:
    """The rows each expert's segment of the layout is padded to: :data:`ALIGN` (128, DeepGEMM's
    contiguous alignment and the masked layouts' tiles), except on the Triton GEMM's contiguous
    layout, whose tiles are :func:`fp8quant.grouped_gemm.kernel_config`'s height for
    ``expected_m`` rows per expert (16 at decode sizes): segments padded to that height hold no
    tile that is all padding, so the GEMMs launch no program that has nothing to do, and the ops
    around them see fewer rows."""
    if backend == "triton" and layout == "contiguous":
        return grouped_gemm.kernel_config(expected_m, contiguous=True).block_m
    return ALIGN


def _gemm(backend: str, layout: str, a: tuple, w: ExpertWeights, d: torch.Tensor, index: torch.Tensor,
          expected_m: int) -> None:  # fmt: skip
    """d = a @ w.T per expert, on the rows the layout's index marks (m_indices or the counts)."""
    if backend == "deep_gemm":
        dg = _deep_gemm()
        if layout == "contiguous":
            dg.m_grouped_fp8_gemm_nt_contiguous(a, (w.q, w.scale), d, index)
        else:
            dg.m_grouped_fp8_gemm_nt_masked(a, (w.q, w.scale), d, index, expected_m)
    elif backend == "triton":
        if layout == "contiguous":
            grouped_gemm.grouped_gemm_contiguous(a, (w.q, w.scale), d, index, expected_m=expected_m)
        else:
            grouped_gemm.grouped_gemm_masked(a, (w.q, w.scale), d, index, expected_m)
    elif layout == "contiguous":
        grouped_gemm.grouped_gemm_torch(a, (w.q, w.scale), d, m_indices=index)
    else:
        grouped_gemm.grouped_gemm_torch(a, (w.q, w.scale), d, masked_m=index)


def expert_ffn(
    q: torch.Tensor,
    scale: torch.Tensor,
    routing: MoeRouting,
    w13: ExpertWeights,
    w2: ExpertWeights,
    *,
    layout: str = "contiguous",
    backend: str = "reference",
    expected_m: int = 1,
    align: int = ALIGN,
) -> torch.Tensor:
    """The experts of the layer on rows already dispatched into a grouped-GEMM layout: each local
    expert's ``W2 @ (silu(g) * u)``, ``[g | u] = W13 @ v``, on the rows ``v`` (block-scaled FP8
    GEMMs, bf16 outputs). :func:`moe_layer` runs it between its dispatch and its combine; an
    expert-parallel layer (:func:`fp8quant.expert_parallel.ep_moe_layer`) on the rows other ranks
    sent.

    Args:
        q, scale: the dispatched rows, float8_e4m3fn ``[rows, H]`` (contiguous layout) or
            ``[E, max_m, H]`` (masked), and their ``mn_tma`` float32 scales, as
            :func:`fp8quant.moe_dispatch_quant` writes them.
        routing: the routing that placed them (``m_indices`` and ``row_offsets`` mark the
            contiguous rows, ``counts`` the masked ones).
        w13, w2: :func:`prepare_experts` of the local experts' ``[E, 2I, H]`` and ``[E, H, I]``.
        layout: ``"contiguous"`` or ``"masked"``.
        backend: ``"deep_gemm"``, ``"triton"`` or ``"reference"`` (module docstring; resolved,
            not ``"auto"``).
        expected_m: typical rows per expert, the GEMMs' tile hint.
        align: rows per tile of the masked layout (their padding rows get zero scales).

    Returns:
        bfloat16 ``[rows, H]`` or ``[E, max_m, H]``: each expert's output on the rows of its tokens
        (other rows are not written).

    Example::

        q, scale = fp8quant.moe_dispatch_quant(x, routing)
        y = expert_ffn(q, scale, routing, w13, w2, backend="triton", expected_m=8)
        out = fp8quant.moe_combine(y, routing.inv_perm, topk_weights)
    """
    if layout not in _FFN_LAYOUTS:
        raise ValueError(f"layout must be one of {_FFN_LAYOUTS}, got {layout!r}")
    if backend not in _FFN_BACKENDS:
        raise ValueError(f"backend must be one of {_FFN_BACKENDS}, got {backend!r}")
    _check_ffn_args(q, scale, routing, w13, w2, layout)
    return _ffn(q, scale, routing, w13, w2, layout, backend, expected_m, align)


def _ffn(q, scale, routing, w13, w2, layout: str, backend: str, expected_m: int, align: int) -> torch.Tensor:
    """:func:`expert_ffn` on checked arguments (moe_layer made them itself)."""
    masked = layout == "masked"
    rows = tuple(q.shape[:-1])
    index = routing.counts if masked else routing.m_indices
    y1 = torch.empty((*rows, w13.shape[1]), dtype=torch.bfloat16, device=q.device)
    _gemm(backend, layout, (q, scale), w13, y1, index, expected_m)
    if masked:
        q2, s2 = silu_mul_quant(y1, masked_m=routing.counts, align=align)
    else:
        q2, s2 = silu_mul_quant(y1, m_indices=routing.m_indices, row_offsets=routing.row_offsets)
    y2 = torch.empty((*rows, w2.shape[1]), dtype=torch.bfloat16, device=q.device)
    _gemm(backend, layout, (q2, s2), w2, y2, index, expected_m)
    return y2


_FFN_LAYOUTS = ("contiguous", "masked")
_FFN_BACKENDS = ("deep_gemm", "triton", "reference")


def check_expert_weights(w13, w2, x: torch.Tensor | None = None, x_name: str = "x") -> None:
    """``w13`` and ``w2`` are :func:`prepare_experts` results that fit each other (``[E, 2I, H]``
    and ``[E, H, I]``, I a multiple of 128) and, given ``x [..., H]`` (the argument ``x_name``),
    its H and device."""
    for name, w in (("w13", w13), ("w2", w2)):
        if not isinstance(w, ExpertWeights):
            raise TypeError(f"{name} must be an ExpertWeights (fp8quant.prepare_experts), got {type(w).__name__}")
        if x is not None and w.q.device != x.device:
            raise ValueError(f"{name} is on {w.q.device}, {x_name} on {x.device}")
    e, two_i, h = w13.shape
    if x is not None and h != x.shape[-1]:
        raise ValueError(f"w13 is [E, 2I, H] = {w13.shape}, but {x_name} has H = {x.shape[-1]}")
    if two_i % 256:
        raise ValueError(f"w13's 2I = {two_i} must be a multiple of 256 (I a multiple of the 128-wide groups)")
    if w2.shape != (e, h, two_i // 2):
        raise ValueError(f"w2 must be [E, H, I] = {(e, h, two_i // 2)} for w13 {w13.shape}, got {w2.shape}")


def _check_ffn_args(q, scale, routing, w13, w2, layout: str) -> None:
    """:func:`expert_ffn`'s operands, each named where it is wrong: the dispatched rows ``q`` and
    their mn_tma ``scale`` in ``layout``, the routing that placed them, and weights that fit them."""
    dims = "[rows, H]" if layout == "contiguous" else "[E, max_m, H]"
    if not isinstance(q, torch.Tensor) or q.dtype != FP8_DTYPE or q.dim() != (2 if layout == "contiguous" else 3):
        got = f"{q.dtype} of shape {tuple(q.shape)}" if isinstance(q, torch.Tensor) else type(q).__name__
        raise TypeError(f"q must be a float8_e4m3fn tensor {dims} for layout={layout!r}, got {got}")
    if not isinstance(scale, torch.Tensor) or scale.dtype != torch.float32:
        got = scale.dtype if isinstance(scale, torch.Tensor) else type(scale).__name__
        raise TypeError(f"scale must be a float32 tensor (q's mn_tma scales), got {got}")
    if not isinstance(routing, MoeRouting):
        raise TypeError(f"routing must be fp8quant.moe_routing's result (a MoeRouting), got {type(routing).__name__}")
    check_expert_weights(w13, w2, q, "q")
    e, _, h = w13.shape
    want = (*q.shape[:-1], h // 128)
    if tuple(scale.shape) != want:
        raise ValueError(f"scale must have shape {want} (q's rows, H / 128 groups), got {tuple(scale.shape)}")
    check_scale_tensor(scale, "mn_tma", torch.float32)
    if routing.counts.numel() != e:
        raise ValueError(f"routing has {routing.counts.numel()} experts, w13 {e}")
    if layout == "contiguous" and routing.m_indices.shape[0] != q.shape[0]:
        raise ValueError(f"routing has {routing.m_indices.shape[0]} contiguous rows, q {q.shape[0]}")
    if layout == "masked" and q.shape[0] != e:
        raise ValueError(f"q [E, max_m, H] has {q.shape[0]} experts, w13 {e}")


def _check_layer_args(x, topk_ids, topk_weights, w13, w2, expert_offset) -> None:
    if not isinstance(x, torch.Tensor) or x.dim() != 2 or x.dtype != torch.bfloat16:
        raise TypeError("x must be a bfloat16 tensor [T, H]")
    if (
        not isinstance(topk_ids, torch.Tensor)
        or topk_ids.dim() != 2
        or topk_ids.dtype not in (torch.int32, torch.int64)
    ):
        raise TypeError("topk_ids must be an int32 or int64 tensor [T, k]")
    if topk_ids.shape[0] != x.shape[0]:
        raise ValueError(f"topk_ids has {topk_ids.shape[0]} tokens, x {x.shape[0]}")
    if (
        not isinstance(topk_weights, torch.Tensor)
        or topk_weights.shape != topk_ids.shape
        or not topk_weights.is_floating_point()
    ):
        raise ValueError(f"topk_weights must be a float tensor of topk_ids' shape {tuple(topk_ids.shape)}")
    check_expert_weights(w13, w2, x)
    check_int(expert_offset, "expert_offset", 0)
    for name, t in (("topk_ids", topk_ids), ("topk_weights", topk_weights)):
        if t.device != x.device:
            raise ValueError(f"{name} is on {t.device}, x on {x.device}")


def moe_layer(
    x: torch.Tensor,
    topk_ids: torch.Tensor,
    topk_weights: torch.Tensor,
    w13: ExpertWeights,
    w2: ExpertWeights,
    *,
    layout: str = "auto",
    backend: str = "auto",
    expert_offset: int = 0,
) -> torch.Tensor:
    """The routed experts of an MoE layer: ``out[t] = sum_j topk_weights[t, j] *
    expert(topk_ids[t, j])(x[t])`` with ``expert(e)(v) = W2[e] @ (silu(g) * u)``, ``[g | u] =
    W13[e] @ v``, every GEMM block-scaled FP8 (1 x 128 activation groups, 128 x 128 weight blocks).

    Args:
        x: bfloat16 ``[T, H]``, H a multiple of 128.
        topk_ids: int32 or int64 ``[T, k]``: each token's experts (global ids; -1, or an id outside
            ``expert_offset .. expert_offset + E - 1``, drops the slot).
        topk_weights: ``[T, k]`` router weights (taken as float32).
        w13: :func:`prepare_experts` of the fused gate and up projections ``[E, 2I, H]`` (gate
            rows first); ``w2``: of the down projection ``[E, H, I]``.
        layout: ``"auto"``, ``"contiguous"`` or ``"masked"`` (module docstring).
        backend: ``"auto"``, ``"deep_gemm"``, ``"triton"`` or ``"reference"``.
        expert_offset: global id of local expert 0 (expert parallelism).

    Returns:
        bfloat16 ``[T, H]``. Capturable in a CUDA graph on the DeepGEMM and Triton backends (no
        host synchronization); the reference backend synchronizes.
    """
    _check_layer_args(x, topk_ids, topk_weights, w13, w2, expert_offset)
    if layout not in _LAYOUTS:
        raise ValueError(f"layout must be one of {_LAYOUTS}, got {layout!r}")
    t, k = topk_ids.shape
    e, two_i, h = w13.shape
    backend, layout = plan(t, _resolve_backend(backend, x), layout)
    if t == 0:
        return torch.zeros_like(x)
    masked = layout == "masked"
    expected_m = max(1, t * k // e)
    align = segment_align(backend, layout, expected_m)
    bounds = moe_bounds(t, k, e, align=align)
    max_m = (
        bounds.max_m if backend != "deep_gemm" else -(-bounds.max_m // DEEP_GEMM_MASKED_ROWS) * DEEP_GEMM_MASKED_ROWS
    )
    routing = moe_routing(
        topk_ids.contiguous(), e, expert_offset=expert_offset, align=align, max_m_sum=bounds.max_m_sum,
        max_m=max_m if masked else None,
    )  # fmt: skip
    weights = topk_weights.float().contiguous()
    if masked:
        q1, s1 = moe_dispatch_quant(x, routing, layout="masked", max_m=max_m, align=ALIGN)
    else:
        q1, s1 = moe_dispatch_quant(x, routing)
    y2 = _ffn(q1, s1, routing, w13, w2, layout, backend, expected_m, ALIGN)
    return moe_combine(y2, routing.masked_row if masked else routing.inv_perm, weights)


class MoELayer(torch.nn.Module):
    """:func:`moe_layer` as a module holding the quantized expert weights (as buffers).

    Example::

        layer = fp8quant.MoELayer.from_weights(gate_up_proj, down_proj).cuda()
        out = layer(hidden_states, topk_ids, topk_weights)
    """

    def __init__(self, w13: ExpertWeights, w2: ExpertWeights, *, layout: str = "auto", backend: str = "auto",
                 expert_offset: int = 0) -> None:  # fmt: skip
        super().__init__()
        if layout not in _LAYOUTS:
            raise ValueError(f"layout must be one of {_LAYOUTS}, got {layout!r}")
        if backend not in _BACKENDS:
            raise ValueError(f"backend must be one of {_BACKENDS}, got {backend!r}")
        check_expert_weights(w13, w2)
        check_int(expert_offset, "expert_offset", 0)
        self.register_buffer("w13_q", w13.q)
        self.register_buffer("w13_scale", w13.scale)
        self.register_buffer("w2_q", w2.q)
        self.register_buffer("w2_scale", w2.scale)
        self.layout, self.backend, self.expert_offset = layout, backend, expert_offset

    @classmethod
    def from_weights(cls, w13: torch.Tensor, w2: torch.Tensor, **kwargs) -> MoELayer:
        """From bf16 expert weights ``[E, 2I, H]`` and ``[E, H, I]`` (quantized here)."""
        return cls(prepare_experts(w13), prepare_experts(w2), **kwargs)

    def forward(self, x: torch.Tensor, topk_ids: torch.Tensor, topk_weights: torch.Tensor) -> torch.Tensor:
        return moe_layer(
            x, topk_ids, topk_weights, ExpertWeights(self.w13_q, self.w13_scale), ExpertWeights(self.w2_q, self.w2_scale),
            layout=self.layout, backend=self.backend, expert_offset=self.expert_offset,
        )  # fmt: skip

    def extra_repr(self) -> str:
        e, two_i, h = self.w13_q.shape
        return f"experts={e}, hidden={h}, intermediate={two_i // 2}, layout={self.layout!r}, backend={self.backend!r}"


def moe_layer_bf16(x: torch.Tensor, topk_ids: torch.Tensor, topk_weights: torch.Tensor, w13: torch.Tensor,
                   w2: torch.Tensor, *, expert_offset: int = 0) -> torch.Tensor:  # fmt: skip
    """The same layer with unquantized weights in float32 (the accuracy oracle of the tests and the
    benchmark): ``w13`` ``[E, 2I, H]``, ``w2`` ``[E, H, I]`` of any float dtype. Returns float32."""
    e, two_i, _ = w13.shape
    out = torch.zeros(x.shape, dtype=torch.float32, device=x.device)
    ids = topk_ids.long() - expert_offset
    for j in range(e):
        token, slot = (ids == j).nonzero(as_tuple=True)
        if token.numel() == 0:
            continue
        gate_up = x[token].float() @ w13[j].float().t()
        act = reference.silu_and_mul(gate_up)
        out.index_add_(0, token, (act @ w2[j].float().t()) * topk_weights[token, slot].float().unsqueeze(1))
    return out
