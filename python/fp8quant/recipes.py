"""What each block-scaled FP8 GEMM reads, as data: one table of recipes (backend, architecture)
-> activation format, weight format and the alignments the GEMM needs (docs/backends.md).

A recipe is the single place a scale format is decided. :func:`fp8quant.quantize_activation` and
:func:`fp8quant.prepare_weight` write what a recipe names, the results carry their format, and
:func:`fp8quant.linear` refuses operands whose formats disagree (SPEC.md section 5: a UE8M0 flag
that differs between quantizer and GEMM gave 0% accuracy in several engines).
"""

from __future__ import annotations

from dataclasses import dataclass

from ._checks import GROUP_SIZES
from .layouts import SCALE_LAYOUTS

__all__ = [
    "BACKENDS",
    "RECIPES",
    "ActivationFormat",
    "Recipe",
    "WeightFormat",
    "describe_recipes",
    "recipe",
]

#: Every backend name a recipe may have ("reference" is fp8quant's own dequantize-and-matmul).
BACKENDS = ("deep_gemm", "cutlass", "scaled_mm", "triton", "reference")
# Weight-scale forms: fp32 [ceil(N/128), ceil(K/128)] row-major, or DeepGEMM SM100's packed rows.
_WEIGHT_SCALES = ("block", "sm100_packed")


def _check_scale_form(arg: str, value: str, choices: tuple[str, ...], packed: str, ue8m0: bool) -> None:
    """``value`` (the argument ``arg``) one of ``choices``; ``ue8m0`` a bool, True for the form
    ``packed`` (packed scales are UE8M0)."""
    if value not in choices:
        raise ValueError(f"{arg} must be one of {choices}, got {value!r}")
    if not isinstance(ue8m0, bool):
        raise TypeError(f"ue8m0 must be a bool, got {type(ue8m0).__name__}")
    if value == packed and not ue8m0:
        raise ValueError(f"ue8m0=False contradicts {arg}={packed!r} (packed scales are UE8M0)")


@dataclass(frozen=True)
class ActivationFormat:
    """How activations ``[M, K]`` are quantized for a GEMM: 1 x ``group_size`` groups, scales in
    ``scale_layout`` (one of :data:`fp8quant.SCALE_LAYOUTS`), rounded up to powers of two when
    ``ue8m0`` (``packed_ue8m0`` always is)."""

    scale_layout: str
    ue8m0: bool
    group_size: int = 128

    def __post_init__(self) -> None:
        _check_scale_form("scale_layout", self.scale_layout, SCALE_LAYOUTS, "packed_ue8m0", self.ue8m0)
        if self.group_size not in GROUP_SIZES:
            raise ValueError(f"group_size must be one of {GROUP_SIZES}, got {self.group_size!r}")

    @property
    def name(self) -> str:
        """``"mn_tma"``, ``"mn_tma+ue8m0"``, ``"packed_ue8m0"`` (bench's format names), with
        ``/64`` appended for a group size other than 128."""
        name = f"{self.scale_layout}+ue8m0" if self.ue8m0 and self.scale_layout != "packed_ue8m0" else self.scale_layout
        return name if self.group_size == 128 else f"{name}/{self.group_size}"


@dataclass(frozen=True)
class WeightFormat:
    """How weights ``[N, K]`` are quantized for a GEMM: 128 x 128 blocks, and the scale tensor's form.

    ``scales``: ``"block"``, fp32 ``[nb, kb]`` (``nb = ceil(N/128)``, ``kb = ceil(K/128)``,
    DeepSeek-V3's ``weight_scale_inv``), row-major; ``"sm100_packed"``, int32 ``[N, ceil(kb/4)]``
    with strides ``(1, align(N, 4))``, each row the UE8M0 bytes of its block row
    (:func:`fp8quant.sm100_weight_scales`). ``ue8m0``: power-of-two scales, the weight
    re-quantized with them. ``scale_cols_align``: the block scales live in a zero-padded
    ``[nb, align(kb, scale_cols_align)]`` buffer and the format's tensor is its ``[nb, kb]`` view
    (4 for ``torch._scaled_mm``, whose cuBLASLt kernel reads rows ``align(kb, 4)`` apart).
    """

    scales: str
    ue8m0: bool
    scale_cols_align: int = 1
    block: tuple[int, int] = (128, 128)

    def __post_init__(self) -> None:
        _check_scale_form("scales", self.scales, _WEIGHT_SCALES, "sm100_packed", self.ue8m0)
        align = self.scale_cols_align
        if isinstance(align, bool) or not isinstance(align, int) or align < 1:
            raise ValueError(f"scale_cols_align must be a positive int, got {self.scale_cols_align!r}")
        if self.scales == "sm100_packed" and self.scale_cols_align != 1:
            raise ValueError("scale_cols_align applies to scales='block' only")
        if tuple(self.block) != (128, 128):
            raise ValueError(f"block must be (128, 128) (the GEMMs' weight blocks), got {self.block!r}")

    @property
    def name(self) -> str:
        """``"block"``, ``"block+ue8m0"``, ``"block/kb4"`` (scale columns padded to 4) or
        ``"sm100_packed"``."""
        if self.scales == "sm100_packed":
            return "sm100_packed"
        name = "block+ue8m0" if self.ue8m0 else "block"
        return name if self.scale_cols_align == 1 else f"{name}/kb{self.scale_cols_align}"


@dataclass(frozen=True)
class Recipe:
    """One backend on one architecture: the formats it reads and the alignments it needs.

    ``arch`` is the compute capability's major number (9: Hopper, 10: datacenter Blackwell; 0 for
    the reference, which runs anywhere). ``m_align``: the GEMM needs M padded to a multiple of it
    (:func:`fp8quant.linear` pads for the backends it runs; a caller of another engine pads
    itself). ``n_align`` / ``k_align``: N and K must be multiples of them. ``runner``: whether
    :func:`fp8quant.linear` calls this backend; the others are formats only, for a caller who
    hands :func:`fp8quant.quantize_activation` and :func:`fp8quant.prepare_weight` outputs to
    that engine's kernel. ``source``: where the facts come from.
    """

    backend: str
    arch: int
    activation: ActivationFormat
    weight: WeightFormat
    m_align: int = 1
    k_align: int = 1
    n_align: int = 1
    runner: bool = False
    source: str = ""

    def __post_init__(self) -> None:
        if self.backend not in BACKENDS:
            raise ValueError(f"backend must be one of {BACKENDS}, got {self.backend!r}")
        for name in ("m_align", "k_align", "n_align"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ValueError(f"{name} must be a positive int, got {value!r}")

    @property
    def name(self) -> str:
        """``"scaled_mm sm90"``; ``"reference"`` for the reference."""
        return self.backend if self.backend == "reference" else f"{self.backend} sm{self.arch}0"


_FP32_MN_TMA = ActivationFormat("mn_tma", ue8m0=False)
_FP32_MN = ActivationFormat("mn", ue8m0=False)
_FP32_ROW = ActivationFormat("row", ue8m0=False)
_PACKED = ActivationFormat("packed_ue8m0", ue8m0=True)
_BLOCK = WeightFormat("block", ue8m0=False)

#: The recipe table (docs/backends.md has it as text, from :func:`describe_recipes`).
RECIPES: tuple[Recipe, ...] = (
    Recipe(
        "deep_gemm", 9, _FP32_MN_TMA, _BLOCK, k_align=128, n_align=64, runner=True,
        source="DeepGEMM csrc/apis/layout.hpp: sfa MN-major TMA-aligned fp32, sfb [nb, kb] contiguous; "
        "N % 64, K % 128 as vLLM routes to it; output bf16 only (the 1D2D kernel). Run on an H200 with "
        "DeepGEMM 2.6.1 (GPU suite: linear against the bf16 product)",
    ),
    Recipe(
        "deep_gemm", 10, _PACKED, WeightFormat("sm100_packed", ue8m0=True), k_align=128, n_align=64, runner=True,
        source="DeepGEMM csrc/apis/layout.hpp: pre-packed int32 UE8M0 scales with recipe (1, 1, 128); "
        "weights re-quantized to power-of-two scales as SGLang/vLLM do; output bf16 or fp32 (the 1D1D "
        "kernel). Not run (no SM100 GPU)",
    ),
    Recipe(
        "scaled_mm", 9, _FP32_MN_TMA, WeightFormat("block", ue8m0=False, scale_cols_align=4),
        m_align=4, k_align=16, n_align=16, runner=True,
        source="torch 2.11 ScaledBlas.cpp, run on an H200: scale_a strides exactly (1, M) and cuBLASLt needs "
        "M % 4 == 0 (SPEC.md 4); K, N % 16; kb % 4 != 0 needs F.scaled_mm and the padded scale_b",
    ),
    Recipe(
        "cutlass", 9, _FP32_MN, _BLOCK, m_align=4,
        source="vLLM cutlass_scaled_mm (c3x): As column-major (1, M), M % 4 == 0 (vLLM pads M); "
        "the weight-scale layout of the current Hopper kernel is unconfirmed",
    ),
    Recipe(
        "cutlass", 10, _FP32_MN, _BLOCK,
        source="vLLM cutlass_scaled_mm (c3x) SM100: As column-major, Bs K-major [nb, kb], M padded "
        "internally; unconfirmed (read from source, not run)",
    ),
    Recipe(
        "triton", 9, _FP32_ROW, _BLOCK,
        source="vLLM w8a8_triton_block_scaled_mm: row-major As, [nb, kb] Bs, any strides; "
        "calc_diff 7e-4 against bf16 on an H200 (SPEC.md 4)",
    ),
    Recipe(
        "triton", 10, _FP32_ROW, _BLOCK,
        source="vLLM w8a8_triton_block_scaled_mm: the same kernel; not run on SM100",
    ),
    Recipe(
        "reference", 0, _FP32_ROW, _BLOCK, runner=True,
        source="fp8quant.gemm: dequantize, matmul in float32 (any device)",
    ),
)  # fmt: skip


def recipe(backend: str, arch: int) -> Recipe:
    """The recipe of ``backend`` on compute capability ``arch`` (major number: 9 or 10);
    ``"reference"`` takes any arch. ValueError listing the valid pairs otherwise."""
    if backend == "reference":
        return RECIPES[-1]
    for r in RECIPES:
        if r.backend == backend and r.arch == arch:
            return r
    pairs = ", ".join(f"({r.backend!r}, {r.arch})" for r in RECIPES if r.backend != "reference")
    raise ValueError(
        f"no recipe for backend={backend!r} on arch={arch!r}; valid (backend, arch) pairs: {pairs}, "
        "and ('reference', any)"
    )


def describe_recipes() -> str:
    """The recipe table as Markdown (docs/backends.md holds a copy)."""
    lines = [
        "| backend | arch | activation scales | weight scales | M align | N align | K align | `linear` | source |",
        "|---|---|---|---|--:|--:|--:|---|---|",
    ]
    for r in RECIPES:
        arch = "any" if r.backend == "reference" else f"sm{r.arch}0"
        lines.append(
            f"| {r.backend} | {arch} | `{r.activation.name}` | `{r.weight.name}` | {r.m_align} | {r.n_align} | "
            f"{r.k_align} | {'yes' if r.runner else 'formats only'} | {r.source} |"
        )
    return "\n".join(lines) + "\n"
