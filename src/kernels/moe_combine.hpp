// Host-side description of one MoE combine, validated by the C API and handed to the launcher of
// the device's architecture.
#pragma once

#include <cstdint>

#include "common/arch.hpp"
#include "fp8quant/common.h"

namespace fp8quant {

struct CombineProblem {
  const void* y;
  const int32_t* rows;   // [t, k]
  const float* weights;  // [t, k]
  void* out;
  int64_t y_row_stride;    // elements
  int64_t out_row_stride;  // elements
  int64_t y_rows;
  int64_t t;  // tokens: grid.x
  int32_t k;
  int32_t h;
  int32_t col_blocks;  // blocks along h: grid.y
  fp8quant_dtype_t dtype;
  bool aligned;  // y, out, their row strides and h allow 16-byte accesses
  bool pdl;      // launch with programmatic dependent launch (fp8quant_set_pdl)
};

FP8QUANT_DECLARE_ARCH_ENTRIES(moe_combine, CombineProblem)

}  // namespace fp8quant
