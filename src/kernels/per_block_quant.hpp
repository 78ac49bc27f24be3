// Host-side description of one per-block (weight) quantization, validated by the C API and
// handed to the launcher of the device's architecture.
#pragma once

#include <cstdint>

#include "common/arch.hpp"
#include "fp8quant/common.h"

namespace fp8quant {

// The block a kernel instantiation quantizes: 128 x 128 elements, one CTA each.
constexpr int32_t kWeightBlock = 128;

struct BlockQuantProblem {
  const void* w;
  const float* w_scale;  // requantization: w is float8_e4m3fn with these block scales; else null
  void* q;
  float* scale;
  int64_t w_batch_stride;      // elements
  int64_t w_row_stride;        // elements
  int64_t q_batch_stride;      // bytes
  int64_t q_row_stride;        // bytes
  int64_t scale_batch_stride;  // scale elements: row_blocks * col_blocks
  int32_t batch;
  int32_t n;
  int32_t k;
  int32_t row_blocks;  // ceil(n / kWeightBlock): grid.y
  int32_t col_blocks;  // ceil(k / kWeightBlock): grid.x
  float eps;
  fp8quant_dtype_t dtype;  // of w, unless w_scale is set
  bool ue8m0;
  bool aligned;  // w and q pointers, strides and k allow 16-byte accesses
  bool pdl;      // launch with programmatic dependent launch (fp8quant_set_pdl)
};

FP8QUANT_DECLARE_ARCH_ENTRIES(per_block_quant, BlockQuantProblem)

}  // namespace fp8quant
