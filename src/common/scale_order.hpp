// How each scale layout orders its scales in memory, and the transforms between layouts: what a
// kernel needs at compile time. The layouts with the same order (mn and mn_tma) differ only in
// run-time sizes, so they share one kernel instantiation.
#pragma once

#include <cstdint>

#include "fp8quant/quant.h"

namespace fp8quant {

enum class ScaleOrder {
  kRow,     // fp32 scale[m * G + g]                              (row)
  kColumn,  // fp32 scale[g * rows + m]                           (mn, mn_tma)
  kPacked,  // byte g % 4 of int32 word scale[(g / 4) * rows + m] (packed_ue8m0)
};

constexpr ScaleOrder scale_order(fp8quant_scale_layout_t layout) {
  return layout == FP8QUANT_SCALE_ROW            ? ScaleOrder::kRow
         : layout == FP8QUANT_SCALE_PACKED_UE8M0 ? ScaleOrder::kPacked
                                                 : ScaleOrder::kColumn;
}

// Where the group quantizer's rows come from (src/kernels/per_token_group_quant.cuh).
enum class QuantSource {
  kRows,     // x's own rows
  kSiluMul,  // silu(gate) * up of x's rows [gate | up], rounded to x's dtype (MoE)
  kScatter,  // x's rows, each stored at the rows of its slots (MoE dispatch)
};

// What a scale transform kernel does to each element (src/kernels/scale_transform.cuh).
enum class ScaleTransform {
  kConvert,  // fp32 -> fp32
  kPack,     // power-of-two fp32 -> four UE8M0 bytes per int32 word
  kUnpack,   // int32 words -> fp32
};

// The block-scaled formats of Blackwell's tensor cores (src/kernels/block_scaled_quant.cuh;
// docs/contract.md, "MXFP8" and "NVFP4").
enum class BlockFormat : int32_t {
  kMxfp8Rceil,  // e4m3 in groups of 32, E8M0 scale by RCEIL
  kMxfp8Floor,  // the same, E8M0 scale by FLOOR
  kNvfp4,       // e2m1 in groups of 16, e4m3 scale, float32 encode scale per tensor or batch
};

}  // namespace fp8quant
