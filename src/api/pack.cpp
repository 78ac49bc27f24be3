// C API of the scale transforms: validate every argument, describe the transform as one
// ScaleTransformProblem, then dispatch on the device's architecture.
#include "fp8quant/pack.h"

#include <cstdint>
#include <string>

#include "api/checks.hpp"
#include "api/device.hpp"
#include "common/error.hpp"
#include "kernels/scale_transform.hpp"

namespace {

using namespace fp8quant::api;
using fp8quant::ScaleTransform;
using fp8quant::ScaleTransformProblem;

bool is_fp32_layout(fp8quant_scale_layout_t layout) {
  return layout == FP8QUANT_SCALE_ROW || layout == FP8QUANT_SCALE_MN || layout == FP8QUANT_SCALE_MN_TMA;
}

fp8quant_status_t check_fp32_layout(fp8quant_scale_layout_t layout, const char* name) {
  FP8QUANT_CHECK_ARG(
      is_fp32_layout(layout), name,
      "must be FP8QUANT_SCALE_ROW, FP8QUANT_SCALE_MN or FP8QUANT_SCALE_MN_TMA, got " + std::to_string(layout));
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

// Everything after each function's own value checks: both buffers' geometry (`src_rows` rows of
// `src_layout`, `rows` of `dst_layout`, both named `m_name`; sizes overflow-checked), then, unless
// there is nothing to convert, the buffer checks and one ScaleTransformProblem. Destination row r
// reads source row r / row_div.
fp8quant_status_t transform(ScaleTransform op, const void* src, const char* src_name,
                            fp8quant_scale_layout_t src_layout, int64_t src_rows, void* dst,
                            fp8quant_scale_layout_t dst_layout, int64_t rows, const char* m_name, int64_t batch,
                            int64_t num_groups, int64_t row_div, uint64_t* first_invalid, cudaStream_t stream) {
  fp8quant_scale_shape_t from{}, to{};
  FP8QUANT_RETURN_IF_ERROR(check_scale_shape(src_layout, batch, src_rows, num_groups, m_name, &from));
  FP8QUANT_RETURN_IF_ERROR(check_scale_shape(dst_layout, batch, rows, num_groups, m_name, &to));
  if (batch == 0 || rows == 0) return FP8QUANT_SUCCESS;  // empty: nothing read, written or launched

  // Buffers
  FP8QUANT_RETURN_IF_ERROR(check_buffer(src, src_name));
  FP8QUANT_RETURN_IF_ERROR(check_buffer(dst, "dst"));
  FP8QUANT_RETURN_IF_ERROR(check_apart_all(src, from.numel, dst, to.numel, first_invalid));

  ScaleTransformProblem p{};
  p.op = op;
  p.first_invalid = reinterpret_cast<unsigned long long*>(first_invalid);
  p.src = src;
  p.src_batch_stride = from.batch_stride;
  p.src_row_stride = from.row_stride;
  p.src_col_stride = from.col_stride;
  p.dst = dst;
  p.dst_batch_stride = to.batch_stride;
  p.dst_rows = to.rows;
  p.dst_cols = to.cols;
  p.total = to.batch_stride * batch;
  p.dst_row_major = dst_layout == FP8QUANT_SCALE_ROW;
  p.rows = rows;
  p.src_rows = src_rows;
  p.groups = num_groups;
  p.row_div = row_div;
  p.pdl = fp8quant::pdl_enabled();
  return fp8quant::launch_for_arch(p, stream, fp8quant::sm90::scale_transform, fp8quant::sm100::scale_transform);
}

}  // namespace

extern "C" {

fp8quant_status_t fp8quant_convert_scales(const float* src, fp8quant_scale_layout_t src_layout, float* dst,
                                          fp8quant_scale_layout_t dst_layout, int64_t batch, int64_t m,
                                          int64_t num_groups, cudaStream_t stream) {
  FP8QUANT_RETURN_IF_ERROR(check_fp32_layout(src_layout, "src_layout"));
  FP8QUANT_RETURN_IF_ERROR(check_fp32_layout(dst_layout, "dst_layout"));
  FP8QUANT_RETURN_IF_ERROR(check_sizes(batch, m, num_groups, "m"));
  return transform(ScaleTransform::kConvert, src, "src", src_layout, m, dst, dst_layout, m, "m", batch, num_groups, 1,
                   nullptr, stream);
}

fp8quant_status_t fp8quant_pack_ue8m0(const float* src, fp8quant_scale_layout_t src_layout, int32_t* dst, int64_t batch,
                                      int64_t m, int64_t num_groups, uint64_t* first_invalid, cudaStream_t stream) {
  FP8QUANT_RETURN_IF_ERROR(check_fp32_layout(src_layout, "src_layout"));
  FP8QUANT_RETURN_IF_ERROR(check_sizes(batch, m, num_groups, "m"));
  return transform(ScaleTransform::kPack, src, "src", src_layout, m, dst, FP8QUANT_SCALE_PACKED_UE8M0, m, "m", batch,
                   num_groups, 1, first_invalid, stream);
}

fp8quant_status_t fp8quant_unpack_ue8m0(const int32_t* src, float* dst, fp8quant_scale_layout_t dst_layout,
                                        int64_t batch, int64_t m, int64_t num_groups, uint64_t* first_invalid,
                                        cudaStream_t stream) {
  FP8QUANT_RETURN_IF_ERROR(check_fp32_layout(dst_layout, "dst_layout"));
  FP8QUANT_RETURN_IF_ERROR(check_sizes(batch, m, num_groups, "m"));
  return transform(ScaleTransform::kUnpack, src, "src", FP8QUANT_SCALE_PACKED_UE8M0, m, dst, dst_layout, m, "m", batch,
                   num_groups, 1, first_invalid, stream);
}

fp8quant_status_t fp8quant_sm100_weight_scales(const float* w_scale, int64_t batch, int64_t n, int64_t k_blocks,
                                               int64_t block_n, int32_t* dst, uint64_t* first_invalid,
                                               cudaStream_t stream) {
  using std::to_string;
  FP8QUANT_CHECK_ARG(block_n > 0, "block_n", "must be > 0, got " + to_string(block_n));
  FP8QUANT_CHECK_ARG(k_blocks > 0, "k_blocks", "must be > 0, got " + to_string(k_blocks));
  FP8QUANT_RETURN_IF_ERROR(check_sizes(batch, n, k_blocks, "n"));
  // The block scales are the row layout of ceil(n / block_n) rows; output row r reads r / block_n
  const int64_t row_blocks = n / block_n + (n % block_n != 0);
  return transform(ScaleTransform::kPack, w_scale, "w_scale", FP8QUANT_SCALE_ROW, row_blocks, dst,
                   FP8QUANT_SCALE_PACKED_UE8M0, n, "n", batch, k_blocks, block_n, first_invalid, stream);
}

}  // extern "C"
