"""fp8quant: fused FP8 quantization kernels that write scales straight into the layouts
block-scaled FP8 GEMMs (DeepGEMM, CUTLASS, cuBLASLt via torch._scaled_mm, Triton) read.

    q, scale = fp8quant.per_token_group_quant(x, 128, scale_layout="mn_tma")   # activations
    w_q, w_scale = fp8quant.per_block_quant(w)                                 # weights, 128 x 128

CUDA tensors run the kernels (compute capability 9.0 or 10.x); CPU tensors run :mod:`fp8quant.reference`.
C++ programs link the same library: ``cmake_dir()`` (``python -m fp8quant --cmake-dir``) is the
folder ``find_package(fp8quant CONFIG)`` needs.
"""

from . import reference
from ._ext import pdl_enabled, set_pdl
from ._install import cmake_dir, cuda_version, include_dir, library_path
from .layouts import SCALE_FORMATS, SCALE_LAYOUTS, ScaleSpec, empty_scale, scale_spec
from .quant import per_token_group_quant
from .weights import per_block_quant

__version__ = "0.1.0"

__all__ = [
    "SCALE_FORMATS",
    "SCALE_LAYOUTS",
    "ScaleSpec",
    "cmake_dir",
    "cuda_version",
    "empty_scale",
    "include_dir",
    "library_path",
    "pdl_enabled",
    "per_block_quant",
    "per_token_group_quant",
    "reference",
    "scale_spec",
    "set_pdl",
]
