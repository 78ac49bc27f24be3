// The block-scaled quantizer's C API body (src/api/mx.cpp), shared by the ops built on its kernel:
// validation, geometry and launch of an MXFP8 or NVFP4 quantization into q [batch, m, k] and an MX
// scale layout, reading x's own rows (mxfp8_quant, nvfp4_quant) or silu(gate) * up of them
// (silu_mul_mxfp8, silu_mul_nvfp4) or scattering them to their experts' rows
// (moe_dispatch_nvfp4); and the MX scale geometry the fused norm shares.
#pragma once

#include <cstdint>

#include "api/group_quant.hpp"
#include "common/scale_order.hpp"
#include "fp8quant/mx.h"
#include "kernels/block_scaled_quant.hpp"

namespace fp8quant::api {

// What a block-scaled quantization writes: the scale layout, the format, and NVFP4's encode
// scales on the device: `global_scales` of them (1: one for all; batch: one per batch; with the
// contiguous layout's m_indices, one per expert, row r taking global_scale[m_indices[r]]; the
// dispatch's contiguous layout gives the expert of each destination row in `row_experts`).
struct BlockScaledOutput {
  fp8quant_mx_scale_layout_t layout = FP8QUANT_MX_SCALE_ROW;
  BlockFormat format = BlockFormat::kMxfp8Rceil;
  const float* global_scale = nullptr;
  int64_t global_scales = 0;
  const int32_t* row_experts = nullptr;
};

// The MX scale buffer of `batch` matrices of `m` rows of `num_groups` (>= 1) groups: a known
// `scale_layout`, batch and m >= 0 and no size past 64 bits (refusals naming `batch_name` and
// `m_name`), and no launch limit. On success *rows and *slots are one matrix's scale rows and
// columns, padding included (the swizzled layout pads rows to 128 and groups to 4), and *bytes
// the whole buffer's size.
fp8quant_status_t mx_scale_geometry(fp8quant_mx_scale_layout_t scale_layout, int64_t batch, int64_t m,
                                    int64_t num_groups, const char* batch_name, const char* m_name, int64_t* rows,
                                    int64_t* slots, int64_t* bytes);

// Validate and launch. `source` is x's own rows (the default), kSiluMul (silu_source) or, for
// NVFP4, kScatter (scatter_source): then batch and m are the destination's and x holds
// source.in_rows tokens.
fp8quant_status_t block_scaled_quant(const void* x, fp8quant_dtype_t x_dtype, int64_t batch, int64_t m, int64_t k,
                                     int64_t x_batch_stride, int64_t x_row_stride, void* q, int64_t q_batch_stride,
                                     int64_t q_row_stride, void* scale, const BlockScaledOutput& out,
                                     const GroupSource& source, cudaStream_t stream);

}  // namespace fp8quant::api
