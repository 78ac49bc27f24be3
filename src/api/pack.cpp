// C API of the scale transforms: validate every argument, describe the transform as one
// ScaleTransformProblem, then dispatch on the device's architecture.
#include <cstdint>
#include <string>

#include "api/checks.hpp"
#include "common/device.hpp"
#include "common/error.hpp"
#include "fp8quant/pack.h"
#include "kernels/scale_transform.hpp"

namespace {

using namespace fp8quant::api;
using fp8quant::ScaleTransform;
using fp8quant::ScaleTransformProblem;

bool is_fp32_layout(fp8quant_scale_layout_t layout) {
  return layout == FP8QUANT_SCALE_ROW || layout == FP8QUANT_SCALE_MN || layout == FP8QUANT_SCALE_MN_TMA;
}

fp8quant_status_t check_fp32_layout(fp8quant_scale_layout_t layout, const char* name) {
  FP8QUANT_CHECK_ARG(is_fp32_layout(layout), name,
                     "must be FP8QUANT_SCALE_ROW, FP8QUANT_SCALE_MN or FP8QUANT_SCALE_MN_TMA, got " +
                         std::to_string(layout));
  return FP8QUANT_SUCCESS;
}

fp8quant_status_t check_sizes(int64_t batch, int64_t m, int64_t num_groups, const char* m_name) {
  using std::to_string;
  FP8QUANT_CHECK_ARG(batch >= 0, "batch", "must be >= 0, got " + to_string(batch));
  FP8QUANT_CHECK_ARG(m >= 0, m_name, "must be >= 0, got " + to_string(m));
  FP8QUANT_CHECK_ARG(num_groups > 0, "num_groups", "must be > 0, got " + to_string(num_groups));
  return FP8QUANT_SUCCESS;
}

// A non-null, 4-byte-aligned scale buffer.
fp8quant_status_t check_buffer(const void* ptr, const char* name) {
  FP8QUANT_CHECK_ARG(ptr != nullptr, name, "must not be null");
  FP8QUANT_CHECK_ARG(reinterpret_cast<uintptr_t>(ptr) % 4 == 0, name, "must be 4-byte aligned");
  return FP8QUANT_SUCCESS;
}

// Source and destination apart, and first_invalid (8 bytes, 8-byte aligned) apart from both.
fp8quant_status_t check_apart_all(const void* src, int64_t src_numel, const void* dst, int64_t dst_numel,
                                  const uint64_t* first_invalid) {
  FP8QUANT_RETURN_IF_ERROR(check_apart("dst", dst, dst_numel * 4, "src", src, src_numel * 4));
  if (first_invalid == nullptr) return FP8QUANT_SUCCESS;
  FP8QUANT_CHECK_ARG(reinterpret_cast<uintptr_t>(first_invalid) % 8 == 0, "first_invalid", "must be 8-byte aligned");
  FP8QUANT_RETURN_IF_ERROR(check_apart("first_invalid", first_invalid, 8, "src", src, src_numel * 4));
  return check_apart("first_invalid", first_invalid, 8, "dst", dst, dst_numel * 4);
}

// Fill the destination half of `p` from the destination's geometry.
void set_destination(ScaleTransformProblem& p, void* dst, const fp8quant_scale_shape_t& shape, int64_t batch,
                     bool row_major) {
  p.dst = dst;
  p.dst_batch_stride = shape.batch_stride;
  p.dst_rows = shape.rows;
  p.dst_cols = shape.cols;
  p.total = shape.batch_stride * batch;
  p.dst_row_major = row_major;
}

void set_source(ScaleTransformProblem& p, const void* src, const fp8quant_scale_shape_t& shape) {
  p.src = src;
  p.src_batch_stride = shape.batch_stride;
  p.src_row_stride = shape.row_stride;
  p.src_col_stride = shape.col_stride;
}

fp8quant_status_t run(ScaleTransformProblem& p, cudaStream_t stream) {
  p.pdl = fp8quant::pdl_enabled();
  return fp8quant::launch_for_arch(p, stream, fp8quant::sm90::scale_transform, fp8quant::sm100::scale_transform);
}

}  // namespace

extern "C" {

fp8quant_status_t fp8quant_convert_scales(const float* src, fp8quant_scale_layout_t src_layout, float* dst,
                                          fp8quant_scale_layout_t dst_layout, int64_t batch, int64_t m,
                                          int64_t num_groups, cudaStream_t stream) {
  // Values
  FP8QUANT_RETURN_IF_ERROR(check_fp32_layout(src_layout, "src_layout"));
  FP8QUANT_RETURN_IF_ERROR(check_fp32_layout(dst_layout, "dst_layout"));
  FP8QUANT_RETURN_IF_ERROR(check_sizes(batch, m, num_groups, "m"));
  fp8quant_scale_shape_t from{}, to{};  // sizes overflow-checked there
  FP8QUANT_RETURN_IF_ERROR(fp8quant_scale_shape(src_layout, batch, m, num_groups, &from));
  FP8QUANT_RETURN_IF_ERROR(fp8quant_scale_shape(dst_layout, batch, m, num_groups, &to));

  // Buffers
  FP8QUANT_RETURN_IF_ERROR(check_buffer(src, "src"));
  FP8QUANT_RETURN_IF_ERROR(check_buffer(dst, "dst"));
  FP8QUANT_RETURN_IF_ERROR(check_apart_all(src, from.numel, dst, to.numel, nullptr));
  if (batch == 0 || m == 0) return FP8QUANT_SUCCESS;  // empty: nothing to launch

  ScaleTransformProblem p{};
  p.op = ScaleTransform::kConvert;
  set_source(p, src, from);
  set_destination(p, dst, to, batch, dst_layout == FP8QUANT_SCALE_ROW);
  p.rows = p.src_rows = m;
  p.groups = num_groups;
  p.row_div = 1;
  return run(p, stream);
}

fp8quant_status_t fp8quant_pack_ue8m0(const float* src, fp8quant_scale_layout_t src_layout, int32_t* dst,
                                      int64_t batch, int64_t m, int64_t num_groups, uint64_t* first_invalid,
                                      cudaStream_t stream) {
  // Values
  FP8QUANT_RETURN_IF_ERROR(check_fp32_layout(src_layout, "src_layout"));
  FP8QUANT_RETURN_IF_ERROR(check_sizes(batch, m, num_groups, "m"));
  fp8quant_scale_shape_t from{}, to{};  // sizes overflow-checked there
  FP8QUANT_RETURN_IF_ERROR(fp8quant_scale_shape(src_layout, batch, m, num_groups, &from));
  FP8QUANT_RETURN_IF_ERROR(fp8quant_scale_shape(FP8QUANT_SCALE_PACKED_UE8M0, batch, m, num_groups, &to));

  // Buffers
  FP8QUANT_RETURN_IF_ERROR(check_buffer(src, "src"));
  FP8QUANT_RETURN_IF_ERROR(check_buffer(dst, "dst"));
  FP8QUANT_RETURN_IF_ERROR(check_apart_all(src, from.numel, dst, to.numel, first_invalid));
  if (batch == 0 || m == 0) return FP8QUANT_SUCCESS;  // empty: nothing to launch

  ScaleTransformProblem p{};
  p.op = ScaleTransform::kPack;
  p.first_invalid = reinterpret_cast<unsigned long long*>(first_invalid);
  set_source(p, src, from);
  set_destination(p, dst, to, batch, false);
  p.rows = p.src_rows = m;
  p.groups = num_groups;
  p.row_div = 1;
  return run(p, stream);
}

fp8quant_status_t fp8quant_unpack_ue8m0(const int32_t* src, float* dst, fp8quant_scale_layout_t dst_layout,
                                        int64_t batch, int64_t m, int64_t num_groups, uint64_t* first_invalid,
                                        cudaStream_t stream) {
  // Values
  FP8QUANT_RETURN_IF_ERROR(check_fp32_layout(dst_layout, "dst_layout"));
  FP8QUANT_RETURN_IF_ERROR(check_sizes(batch, m, num_groups, "m"));
  fp8quant_scale_shape_t from{}, to{};  // sizes overflow-checked there
  FP8QUANT_RETURN_IF_ERROR(fp8quant_scale_shape(FP8QUANT_SCALE_PACKED_UE8M0, batch, m, num_groups, &from));
  FP8QUANT_RETURN_IF_ERROR(fp8quant_scale_shape(dst_layout, batch, m, num_groups, &to));

  // Buffers
  FP8QUANT_RETURN_IF_ERROR(check_buffer(src, "src"));
  FP8QUANT_RETURN_IF_ERROR(check_buffer(dst, "dst"));
  FP8QUANT_RETURN_IF_ERROR(check_apart_all(src, from.numel, dst, to.numel, first_invalid));
  if (batch == 0 || m == 0) return FP8QUANT_SUCCESS;  // empty: nothing to launch

  ScaleTransformProblem p{};
  p.op = ScaleTransform::kUnpack;
  p.first_invalid = reinterpret_cast<unsigned long long*>(first_invalid);
  set_source(p, src, from);
  set_destination(p, dst, to, batch, dst_layout == FP8QUANT_SCALE_ROW);
  p.rows = p.src_rows = m;
  p.groups = num_groups;
  p.row_div = 1;
  return run(p, stream);
}

fp8quant_status_t fp8quant_sm100_weight_scales(const float* w_scale, int64_t batch, int64_t n, int64_t k_blocks,
                                               int64_t block_n, int32_t* dst, uint64_t* first_invalid,
                                               cudaStream_t stream) {
  using std::to_string;
  // Values
  FP8QUANT_CHECK_ARG(block_n > 0, "block_n", "must be > 0, got " + to_string(block_n));
  FP8QUANT_CHECK_ARG(k_blocks > 0, "k_blocks", "must be > 0, got " + to_string(k_blocks));
  FP8QUANT_RETURN_IF_ERROR(check_sizes(batch, n, k_blocks, "n"));
  const int64_t row_blocks = n / block_n + (n % block_n != 0);
  fp8quant_scale_shape_t from{}, to{};  // the block scales are the row layout of row_blocks rows
  FP8QUANT_RETURN_IF_ERROR(fp8quant_scale_shape(FP8QUANT_SCALE_ROW, batch, row_blocks, k_blocks, &from));
  FP8QUANT_RETURN_IF_ERROR(fp8quant_scale_shape(FP8QUANT_SCALE_PACKED_UE8M0, batch, n, k_blocks, &to));

  // Buffers
  FP8QUANT_RETURN_IF_ERROR(check_buffer(w_scale, "w_scale"));
  FP8QUANT_RETURN_IF_ERROR(check_buffer(dst, "dst"));
  FP8QUANT_RETURN_IF_ERROR(check_apart_all(w_scale, from.numel, dst, to.numel, first_invalid));
  if (batch == 0 || n == 0) return FP8QUANT_SUCCESS;  // empty: nothing to launch

  ScaleTransformProblem p{};
  p.op = ScaleTransform::kPack;
  p.first_invalid = reinterpret_cast<unsigned long long*>(first_invalid);
  set_source(p, w_scale, from);
  set_destination(p, dst, to, batch, false);
  p.rows = n;
  p.src_rows = row_blocks;
  p.groups = k_blocks;
  p.row_div = block_n;
  return run(p, stream);
}

}  // extern "C"
