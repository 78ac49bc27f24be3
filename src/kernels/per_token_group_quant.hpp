// Host-side description of one per-token-group quantization, validated by the C API and
// handed to the launcher of the device's architecture.
#pragma once

#include <cstdint>

#include "fp8quant/quant.h"

namespace fp8quant {

struct QuantProblem {
  const void* x;
  void* q;
  void* scale;
  int64_t x_batch_stride;      // elements
  int64_t x_row_stride;        // elements
  int64_t q_batch_stride;      // bytes
  int64_t q_row_stride;        // bytes
  int64_t scale_batch_stride;  // scale elements
  int32_t batch;
  int32_t m;
  int32_t num_groups;
  int32_t rows;   // rows of the scale layout: m, or align(m, 4) for the TMA-aligned layouts
  int32_t slots;  // group slots per row: num_groups, or 4 * ceil(num_groups / 4) when packed
  int32_t units;  // teams one batch launches: rows * slots
  float eps;
  fp8quant_dtype_t dtype;
  fp8quant_scale_layout_t layout;
  int32_t group_size;
  bool ue8m0;
  bool aligned;  // x and q pointers and strides allow 16-byte accesses
};

namespace sm90 {
cudaError_t per_token_group_quant(const QuantProblem& problem, cudaStream_t stream);
}  // namespace sm90

namespace sm100 {
cudaError_t per_token_group_quant(const QuantProblem& problem, cudaStream_t stream);
}  // namespace sm100

}  // namespace fp8quant
