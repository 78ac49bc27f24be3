// C API of the RMSNorm kernels: validate every argument, then dispatch on the device's
// architecture. fp8quant_rms_norm, fp8quant_rms_norm_quant and the block-scaled forms
// (fp8quant_rms_norm_mxfp8, fp8quant_rms_norm_nvfp4) share one body; they differ in their output
// (y, or q and its scales).
#include "fp8quant/norm.h"

#include <cmath>
#include <cstdint>
#include <string>

#include "api/block_scaled.hpp"
#include "api/checks.hpp"
#include "api/device.hpp"
#include "common/error.hpp"
#include "kernels/rms_norm.hpp"

namespace {

using namespace fp8quant::api;

constexpr int64_t kMaxRows = INT32_MAX - 3;  // grid.x, with the TMA-aligned layouts' padding rows
// One block per scale row (grid.x), padding included: the swizzled layout pads m to 128
constexpr int64_t kMaxSwizzledRows = INT32_MAX / 128 * 128;

// The quantized output of fp8quant_rms_norm_quant (FP8 groups) or of the block-scaled forms
// (`block`); absent for fp8quant_rms_norm.
struct QuantOutput {
  void* scale = nullptr;
  fp8quant_scale_layout_t layout = FP8QUANT_SCALE_ROW;
  int ue8m0 = 0;
  int64_t group_size = 0;
  float eps = 0.0f;
  const BlockScaledOutput* block = nullptr;
};

bool is_layout(fp8quant_scale_layout_t layout) {
  return layout == FP8QUANT_SCALE_ROW || layout == FP8QUANT_SCALE_MN || layout == FP8QUANT_SCALE_MN_TMA ||
         layout == FP8QUANT_SCALE_PACKED_UE8M0;
}

// A pointer and row stride (elements of `elem` bytes) aligned to the kernel's vector accesses:
// 16 bytes, or 8 for NVFP4's q (a thread's 16 elements are 8 bytes).
fp8quant_status_t check_aligned(const Operand& t, int64_t bytes = 16) {
  using std::to_string;
  FP8QUANT_CHECK_ARG(reinterpret_cast<uintptr_t>(t.ptr) % bytes == 0, t.name,
                     "must be " + to_string(bytes) + "-byte aligned");
  FP8QUANT_CHECK_ARG(t.row_stride * t.elem % bytes == 0, t.row_stride_name,
                     "must be a multiple of " + to_string(bytes / t.elem) + " elements (" + to_string(bytes) +
                         " bytes), got " + to_string(t.row_stride));
  return FP8QUANT_SUCCESS;
}

fp8quant_status_t rms_norm(const void* x, void* residual, const void* weight, fp8quant_dtype_t dtype, int64_t m,
                           int64_t h, int64_t x_row_stride, int64_t residual_row_stride, float eps, void* out,
                           int64_t out_row_stride, const QuantOutput* quant, cudaStream_t stream) {
  using std::to_string;
  const int64_t elem = dtype_size(dtype);
  const char* out_name = quant ? "q" : "y";

  // Values
  FP8QUANT_CHECK_ARG(dtype == FP8QUANT_DTYPE_BFLOAT16 || dtype == FP8QUANT_DTYPE_FLOAT16, "dtype",
                     "must be BFLOAT16 or FLOAT16, got " + to_string(dtype));
  FP8QUANT_CHECK_ARG(
      h > 0 && h % fp8quant::kNormSliceElems == 0 && h <= fp8quant::kNormMaxH, "h",
      "must be a positive multiple of 16, at most " + to_string(fp8quant::kNormMaxH) + ", got " + to_string(h));
  FP8QUANT_CHECK_ARG(m >= 0 && m <= kMaxRows, "m", "must be in [0, " + to_string(kMaxRows) + "], got " + to_string(m));
  FP8QUANT_CHECK_ARG(std::isfinite(eps) && eps >= 0.0f, "eps", "must be finite and >= 0, got " + float_text(eps));
  int64_t scale_rows = m, scale_bytes = 0, num_groups = 0, scale_slots = 0, q_cols = h;
  const BlockScaledOutput* block = quant ? quant->block : nullptr;
  if (block) {
    // The block per row indexes its scales in int64: no limit on scale slots, only grid.x's on rows
    const bool fp4 = block->format == fp8quant::BlockFormat::kNvfp4;
    const int64_t group = fp4 ? fp8quant::kNvfp4Group : fp8quant::kMxGroup;
    FP8QUANT_CHECK_ARG(h % group == 0, "h", "must be a multiple of " + to_string(group) + ", got " + to_string(h));
    num_groups = h / group;
    q_cols = fp4 ? h / 2 : h;
    FP8QUANT_RETURN_IF_ERROR(
        mx_scale_geometry(block->layout, 1, m, num_groups, "batch", "m", &scale_rows, &scale_slots, &scale_bytes));
    FP8QUANT_CHECK_ARG(block->layout != FP8QUANT_MX_SCALE_SWIZZLED || m <= kMaxSwizzledRows, "m",
                       "must be at most " + to_string(kMaxSwizzledRows) +
                           " with the swizzled layout (its rows, padded to 128, go on grid.x), got " + to_string(m));
  } else if (quant) {
    FP8QUANT_CHECK_ARG(is_layout(quant->layout), "scale_layout", "unknown scale layout " + to_string(quant->layout));
    FP8QUANT_CHECK_ARG(quant->layout != FP8QUANT_SCALE_PACKED_UE8M0 || quant->ue8m0, "ue8m0",
                       "must be nonzero with FP8QUANT_SCALE_PACKED_UE8M0 (packed scales are UE8M0)");
    FP8QUANT_CHECK_ARG(quant->group_size == 32 || quant->group_size == 64 || quant->group_size == 128, "group_size",
                       "must be 32, 64 or 128, got " + to_string(quant->group_size));
    FP8QUANT_CHECK_ARG(h % quant->group_size == 0, "h",
                       "must be a multiple of group_size (" + to_string(quant->group_size) + "), got " + to_string(h));
    FP8QUANT_RETURN_IF_ERROR(check_eps(quant->eps, "quant_eps"));
    num_groups = h / quant->group_size;
    fp8quant_scale_shape_t shape{};
    FP8QUANT_RETURN_IF_ERROR(fp8quant_scale_shape(quant->layout, 1, m, num_groups, &shape));
    scale_rows = shape.rows;
    scale_bytes = shape.numel * 4;
  }
  // Every stride belongs to the rows, never stepped over without rows: an empty call is done
  if (m == 0) return FP8QUANT_SUCCESS;

  // Buffers: present, aligned, spans within 2^63 bytes, outputs apart from everything else
  Operand xs{"x", "x_row_stride", "", x, elem, 0, x_row_stride};
  Operand ws{"weight", "", "", weight, elem, 0, 0};
  Operand rs{"residual", "residual_row_stride", "", residual, elem, 0, residual_row_stride};
  Operand os{out_name, quant ? "q_row_stride" : "y_row_stride", "", out, quant ? 1 : elem, 0, out_row_stride};
  for (const Operand* t : {&xs, &ws, &os}) FP8QUANT_CHECK_ARG(t->ptr != nullptr, t->name, "must not be null");
  FP8QUANT_RETURN_IF_ERROR(check_input(xs, 1, m, h));
  FP8QUANT_RETURN_IF_ERROR(check_input(ws, 1, 1, h));
  FP8QUANT_RETURN_IF_ERROR(check_output(os, 1, m, q_cols));
  for (const Operand* t : {&xs, &ws}) FP8QUANT_RETURN_IF_ERROR(check_aligned(*t));
  FP8QUANT_RETURN_IF_ERROR(check_aligned(os, q_cols < h ? 8 : 16));
  FP8QUANT_RETURN_IF_ERROR(check_apart(os.name, out, os.bytes, "x", x, xs.bytes));
  FP8QUANT_RETURN_IF_ERROR(check_apart(os.name, out, os.bytes, "weight", weight, ws.bytes));
  if (residual != nullptr) {
    FP8QUANT_RETURN_IF_ERROR(check_output(rs, 1, m, h));
    FP8QUANT_RETURN_IF_ERROR(check_aligned(rs));
    FP8QUANT_RETURN_IF_ERROR(check_apart("residual", residual, rs.bytes, "x", x, xs.bytes));
    FP8QUANT_RETURN_IF_ERROR(check_apart("residual", residual, rs.bytes, "weight", weight, ws.bytes));
    FP8QUANT_RETURN_IF_ERROR(check_apart(os.name, out, os.bytes, "residual", residual, rs.bytes));
  }
  if (quant) {
    FP8QUANT_CHECK_ARG(quant->scale != nullptr, "scale", "must not be null");
    FP8QUANT_CHECK_ARG(reinterpret_cast<uintptr_t>(quant->scale) % 4 == 0, "scale", "must be 4-byte aligned");
    FP8QUANT_RETURN_IF_ERROR(check_apart("scale", quant->scale, scale_bytes, "x", x, xs.bytes));
    FP8QUANT_RETURN_IF_ERROR(check_apart("scale", quant->scale, scale_bytes, "weight", weight, ws.bytes));
    FP8QUANT_RETURN_IF_ERROR(check_apart("scale", quant->scale, scale_bytes, "q", out, os.bytes));
    if (residual != nullptr) {
      FP8QUANT_RETURN_IF_ERROR(check_apart("scale", quant->scale, scale_bytes, "residual", residual, rs.bytes));
    }
  }
  if (block && block->format == fp8quant::BlockFormat::kNvfp4) {
    const void* gs = block->global_scale;
    FP8QUANT_CHECK_ARG(gs != nullptr, "global_scale", "must not be null");
    FP8QUANT_CHECK_ARG(reinterpret_cast<uintptr_t>(gs) % 4 == 0, "global_scale", "must be 4-byte aligned");
    FP8QUANT_RETURN_IF_ERROR(check_apart("q", out, os.bytes, "global_scale", gs, 4));
    FP8QUANT_RETURN_IF_ERROR(check_apart("scale", quant->scale, scale_bytes, "global_scale", gs, 4));
    if (residual != nullptr)
      FP8QUANT_RETURN_IF_ERROR(check_apart("residual", residual, rs.bytes, "global_scale", gs, 4));
  }

  fp8quant::NormProblem problem{};
  problem.x = x;
  problem.residual = residual;
  problem.weight = weight;
  problem.out = out;
  problem.x_row_stride = xs.row_stride;
  problem.residual_row_stride = rs.row_stride;
  problem.out_row_stride = os.row_stride;
  problem.m = static_cast<int32_t>(m);
  problem.h = static_cast<int32_t>(h);
  problem.rows = static_cast<int32_t>(scale_rows);
  problem.slices = static_cast<int32_t>(h / fp8quant::kNormSliceElems);
  const int32_t warps = (problem.slices + 31) / 32;
  problem.fold_warps = 1;
  while (problem.fold_warps < warps) problem.fold_warps *= 2;
  problem.eps = eps;
  problem.dtype = dtype;
  problem.pdl = fp8quant::pdl_enabled();
  if (block) {
    problem.scale_bytes = static_cast<uint8_t*>(quant->scale);
    problem.num_groups = static_cast<int32_t>(num_groups);
    problem.slots = static_cast<int32_t>(scale_slots);
    problem.block_scaled = true;
    problem.format = block->format;
    problem.mx_layout = block->layout;
    problem.global_scale = block->global_scale;
  } else if (quant) {
    problem.scale = quant->scale;
    problem.num_groups = static_cast<int32_t>(num_groups);
    problem.group_size = static_cast<int32_t>(quant->group_size);
    problem.quant_eps = quant->eps;
    problem.layout = quant->layout;
    problem.ue8m0 = quant->ue8m0 != 0;
    problem.quantize = true;
  }
  return fp8quant::launch_for_arch(problem, stream, fp8quant::sm90::rms_norm, fp8quant::sm100::rms_norm);
}

}  // namespace

extern "C" {

fp8quant_status_t fp8quant_rms_norm(const void* x, void* residual, const void* weight, fp8quant_dtype_t dtype,
                                    int64_t m, int64_t h, int64_t x_row_stride, int64_t residual_row_stride, float eps,
                                    void* y, int64_t y_row_stride, cudaStream_t stream) {
  return rms_norm(x, residual, weight, dtype, m, h, x_row_stride, residual_row_stride, eps, y, y_row_stride, nullptr,
                  stream);
}

fp8quant_status_t fp8quant_rms_norm_quant(const void* x, void* residual, const void* weight, fp8quant_dtype_t dtype,
                                          int64_t m, int64_t h, int64_t x_row_stride, int64_t residual_row_stride,
                                          float eps, void* q, int64_t q_row_stride, void* scale,
                                          fp8quant_scale_layout_t scale_layout, int ue8m0, int64_t group_size,
                                          float quant_eps, cudaStream_t stream) {
  const QuantOutput quant{scale, scale_layout, ue8m0, group_size, quant_eps};
  return rms_norm(x, residual, weight, dtype, m, h, x_row_stride, residual_row_stride, eps, q, q_row_stride, &quant,
                  stream);
}

fp8quant_status_t fp8quant_rms_norm_mxfp8(const void* x, void* residual, const void* weight, fp8quant_dtype_t dtype,
                                          int64_t m, int64_t h, int64_t x_row_stride, int64_t residual_row_stride,
                                          float eps, void* q, int64_t q_row_stride, void* scale,
                                          fp8quant_mx_scale_layout_t scale_layout, fp8quant_mx_recipe_t recipe,
                                          cudaStream_t stream) {
  FP8QUANT_CHECK_ARG(recipe == FP8QUANT_MX_RCEIL || recipe == FP8QUANT_MX_FLOOR, "recipe",
                     "unknown MX recipe " + std::to_string(recipe));
  const BlockScaledOutput block{
      scale_layout,
      recipe == FP8QUANT_MX_FLOOR ? fp8quant::BlockFormat::kMxfp8Floor : fp8quant::BlockFormat::kMxfp8Rceil, nullptr,
      0};
  QuantOutput quant;
  quant.scale = scale;
  quant.block = &block;
  return rms_norm(x, residual, weight, dtype, m, h, x_row_stride, residual_row_stride, eps, q, q_row_stride, &quant,
                  stream);
}

fp8quant_status_t fp8quant_rms_norm_nvfp4(const void* x, void* residual, const void* weight, fp8quant_dtype_t dtype,
                                          int64_t m, int64_t h, int64_t x_row_stride, int64_t residual_row_stride,
                                          float eps, void* q, int64_t q_row_stride, void* scale,
                                          fp8quant_mx_scale_layout_t scale_layout, const float* global_scale,
                                          cudaStream_t stream) {
  const BlockScaledOutput block{scale_layout, fp8quant::BlockFormat::kNvfp4, global_scale, 1};
  QuantOutput quant;
  quant.scale = scale;
  quant.block = &block;
  return rms_norm(x, residual, weight, dtype, m, h, x_row_stride, residual_row_stride, eps, q, q_row_stride, &quant,
                  stream);
}

}  // extern "C"
