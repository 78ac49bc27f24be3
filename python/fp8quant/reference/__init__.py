"""Pure-PyTorch reference of every fp8quant op: the oracle the CUDA kernels are tested against,
and the implementation used for CPU tensors.

It follows SPEC.md literally and favours exactness over speed: divisions are done in float64
and rounded once to float32, which equals IEEE float32 division for every input (a float64
quotient of two float32 numbers is never a double-rounding hazard: 53 >= 2*24 + 2).
"""

from __future__ import annotations

from ._core import FP8_MAX, dequantize_blocks, dequantize_groups, quantize_groups, ue8m0_round_up
from .moe import (
    moe_combine,
    moe_dispatch_nvfp4,
    moe_dispatch_quant,
    moe_routing,
    moe_scatter_nvfp4,
    moe_scatter_quant,
    silu_and_mul,
    silu_mul_mxfp8,
    silu_mul_nvfp4,
    silu_mul_quant,
)
from .mx import mxfp8_dequant, mxfp8_quant
from .norm import inverse_rms, rms_norm, rms_norm_mxfp8, rms_norm_nvfp4, rms_norm_quant, sum_of_squares
from .nvfp4 import nvfp4_dequant, nvfp4_global_scale, nvfp4_quant
from .pack import convert_scales, pack_ue8m0, sm100_weight_scales, unpack_ue8m0
from .quant import per_token_group_quant
from .weights import per_block_quant, requantize_ue8m0

__all__ = [
    "FP8_MAX",
    "convert_scales",
    "dequantize_blocks",
    "dequantize_groups",
    "inverse_rms",
    "moe_combine",
    "moe_dispatch_nvfp4",
    "moe_dispatch_quant",
    "moe_routing",
    "moe_scatter_nvfp4",
    "moe_scatter_quant",
    "mxfp8_dequant",
    "mxfp8_quant",
    "nvfp4_dequant",
    "nvfp4_global_scale",
    "nvfp4_quant",
    "pack_ue8m0",
    "per_block_quant",
    "per_token_group_quant",
    "quantize_groups",
    "requantize_ue8m0",
    "rms_norm",
    "rms_norm_mxfp8",
    "rms_norm_nvfp4",
    "rms_norm_quant",
    "silu_and_mul",
    "silu_mul_mxfp8",
    "silu_mul_nvfp4",
    "silu_mul_quant",
    "sm100_weight_scales",
    "sum_of_squares",
    "ue8m0_round_up",
    "unpack_ue8m0",
]
