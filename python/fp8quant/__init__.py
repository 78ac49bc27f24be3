"""fp8quant: fused FP8 quantization kernels that write scales straight into the layouts
block-scaled FP8 GEMMs (DeepGEMM, CUTLASS, cuBLASLt via torch._scaled_mm, Triton) read.

    q, scale = fp8quant.per_token_group_quant(x, 128, scale_layout="mn_tma")   # activations
    w_q, w_scale = fp8quant.per_block_quant(w)                                 # weights, 128 x 128
    q, scale, residual = fp8quant.rms_norm_quant(x, norm_weight, residual=residual)  # norm + quant
    y = fp8quant.linear(x, fp8quant.prepare_weight(w))                         # FP8 GEMM (fp8quant.gemm)
    out = fp8quant.moe_layer(x, topk_ids, topk_weights, w13, w2)                # MoE layer (fp8quant.moe_layer)

CUDA tensors run the kernels (compute capability 9.0 or 10.x); CPU tensors run :mod:`fp8quant.reference`.
C++ programs link the same library: ``cmake_dir()`` (``python -m fp8quant --cmake-dir``) is the
folder ``find_package(fp8quant CONFIG)`` needs.
"""

from . import reference
from ._ext import pdl_enabled, set_pdl
from ._install import cmake_dir, cuda_version, include_dir, library_path
from .gemm import (
    FormatMismatchError,
    QuantizedActivation,
    QuantizedWeight,
    linear,
    prepare_weight,
    quantize_activation,
    select_backend,
)
from .layouts import SCALE_FORMATS, SCALE_LAYOUTS, ScaleSpec, empty_scale, scale_spec
from .moe import (
    MoeBounds,
    moe_bounds,
    moe_combine,
    moe_dispatch_nvfp4,
    moe_dispatch_quant,
    moe_routing,
    silu_mul_mxfp8,
    silu_mul_nvfp4,
    silu_mul_quant,
)
from .moe_layer import ExpertWeights, MoELayer, expert_ffn, moe_layer, prepare_experts
from .mx import (
    MX_RECIPES,
    MX_SCALE_LAYOUTS,
    mxfp8_dequant,
    mxfp8_quant,
    nvfp4_dequant,
    nvfp4_global_scale,
    nvfp4_quant,
)
from .norm import rms_norm, rms_norm_mxfp8, rms_norm_nvfp4, rms_norm_quant
from .pack import convert_scales, pack_ue8m0, sm100_weight_scales, unpack_ue8m0
from .quant import per_token_group_quant
from .recipes import RECIPES, ActivationFormat, Recipe, WeightFormat, recipe
from .routing import MoeRouting
from .weights import per_block_quant, requantize_ue8m0

__version__ = "0.1.0"

__all__ = [
    "ActivationFormat",
    "ExpertWeights",
    "FormatMismatchError",
    "MoELayer",
    "MoeBounds",
    "MoeRouting",
    "MX_RECIPES",
    "MX_SCALE_LAYOUTS",
    "QuantizedActivation",
    "QuantizedWeight",
    "RECIPES",
    "Recipe",
    "SCALE_FORMATS",
    "SCALE_LAYOUTS",
    "ScaleSpec",
    "WeightFormat",
    "cmake_dir",
    "convert_scales",
    "cuda_version",
    "empty_scale",
    "expert_ffn",
    "include_dir",
    "library_path",
    "moe_bounds",
    "moe_combine",
    "moe_dispatch_nvfp4",
    "moe_dispatch_quant",
    "moe_layer",
    "moe_routing",
    "mxfp8_dequant",
    "mxfp8_quant",
    "nvfp4_dequant",
    "nvfp4_global_scale",
    "nvfp4_quant",
    "linear",
    "pack_ue8m0",
    "pdl_enabled",
    "per_block_quant",
    "per_token_group_quant",
    "prepare_experts",
    "prepare_weight",
    "quantize_activation",
    "recipe",
    "reference",
    "requantize_ue8m0",
    "rms_norm",
    "rms_norm_mxfp8",
    "rms_norm_nvfp4",
    "rms_norm_quant",
    "scale_spec",
    "select_backend",
    "set_pdl",
    "silu_mul_mxfp8",
    "silu_mul_nvfp4",
    "silu_mul_quant",
    "sm100_weight_scales",
    "unpack_ue8m0",
]
