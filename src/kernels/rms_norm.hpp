// Host-side description of one RMSNorm (optionally after a residual add, optionally quantized:
// FP8 in groups, or block-scaled), validated by the C API and handed to the launcher of the
// device's architecture.
#pragma once

#include <cstdint>

#include "common/arch.hpp"
#include "common/scale_order.hpp"
#include "fp8quant/mx.h"
#include "fp8quant/norm.h"
#include "fp8quant/quant.h"

namespace fp8quant {

// The block that normalizes one row holds one 16-element slice per thread.
constexpr int64_t kNormSliceElems = 16;
constexpr int64_t kNormMaxThreads = 1024;
constexpr int64_t kNormMaxH = kNormSliceElems * kNormMaxThreads;  // 16384

struct NormProblem {
  const void* x;                // [m, h]
  void* residual;               // [m, h], read then overwritten with x + residual; null: no residual
  const void* weight;           // [h]
  void* out;                    // rms_norm: y [m, h] of x's dtype; rms_norm_quant: q [m, h] float8_e4m3fn
  void* scale;                  // rms_norm_quant: the scale layout's buffer; null for rms_norm
  int64_t x_row_stride;         // elements
  int64_t residual_row_stride;  // elements
  int64_t out_row_stride;       // elements of out
  int32_t m;
  int32_t h;
  int32_t rows;        // grid.x: scale rows, padding included (m for rms_norm)
  int32_t slices;      // h / 16: the threads that hold data
  int32_t fold_warps;  // W: the power of two >= ceil(slices / 32) the row's warp totals fold over
  int32_t num_groups;  // h / group_size
  int32_t group_size;
  float eps;        // RMSNorm's
  float quant_eps;  // the quantizer's amax floor
  fp8quant_dtype_t dtype;
  fp8quant_scale_layout_t layout;
  bool ue8m0;
  bool quantize;  // rms_norm_quant
  bool pdl;       // launch with programmatic dependent launch (fp8quant_set_pdl)

  // Block-scaled output (rms_norm_mxfp8, rms_norm_nvfp4): q in `format`, one scale byte per
  // group in scale_bytes (mx_layout); `rows` and `slots` are the layout's, padding included
  bool block_scaled;
  BlockFormat format;
  fp8quant_mx_scale_layout_t mx_layout;
  uint8_t* scale_bytes;
  int32_t slots;              // scale columns per row: num_groups, or rounded up to 4 when swizzled
  const float* global_scale;  // NVFP4: the encode scale, on the device
};

FP8QUANT_DECLARE_ARCH_ENTRIES(rms_norm, NormProblem)

}  // namespace fp8quant
