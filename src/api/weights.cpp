// C API of the weight quantization kernels: validate every argument, then dispatch on the
// device's architecture.
#include "fp8quant/weights.h"

#include <cstdint>
#include <string>

#include "api/checks.hpp"
#include "api/device.hpp"
#include "common/error.hpp"
#include "kernels/per_block_quant.hpp"

namespace {

using namespace fp8quant::api;

constexpr int64_t kMaxGrid = 65535;  // blocks of rows on grid.y, batches on grid.z
constexpr int64_t kMaxCols = (int64_t{1} << 31) - 1 - fp8quant::kWeightBlock;  // k is int32 on the device

int64_t ceil_div(int64_t a, int64_t b) { return (a + b - 1) / b; }

// Validate and launch a per-block quantization of `w` (elements of `elem` bytes, `dtype`), or,
// with `requantize`, a requantization of the float8_e4m3fn `w` with the block scales `w_scale`.
fp8quant_status_t quantize_blocks(const void* w, int64_t elem, fp8quant_dtype_t dtype, bool requantize,
                                  const float* w_scale, int64_t batch, int64_t n, int64_t k, int64_t w_batch_stride,
                                  int64_t w_row_stride, void* q, int64_t q_batch_stride, int64_t q_row_stride,
                                  float* scale, int64_t block_n, int64_t block_k, bool ue8m0, float eps,
                                  cudaStream_t stream) {
  using std::to_string;
  constexpr int64_t kBlock = fp8quant::kWeightBlock;

  // Values
  FP8QUANT_CHECK_ARG(block_n == kBlock, "block_n", "must be " + to_string(kBlock) + ", got " + to_string(block_n));
  FP8QUANT_CHECK_ARG(block_k == kBlock, "block_k", "must be " + to_string(kBlock) + ", got " + to_string(block_k));
  FP8QUANT_CHECK_ARG(batch >= 0 && batch <= kMaxGrid, "batch",
                     "must be in [0, " + to_string(kMaxGrid) + "], got " + to_string(batch));
  FP8QUANT_CHECK_ARG(n >= 0 && n <= kMaxGrid * kBlock, "n",
                     "must be in [0, " + to_string(kMaxGrid * kBlock) + "], got " + to_string(n));
  FP8QUANT_CHECK_ARG(k > 0 && k <= kMaxCols, "k", "must be in [1, " + to_string(kMaxCols) + "], got " + to_string(k));
  FP8QUANT_RETURN_IF_ERROR(check_eps(eps));

  // Strides and spans, every call; then an empty one is done: nothing read, written or launched
  Operand ws{"w", "w_row_stride", "w_batch_stride", w, elem, w_batch_stride, w_row_stride};
  Operand qs{"q", "q_row_stride", "q_batch_stride", q, 1, q_batch_stride, q_row_stride};
  FP8QUANT_RETURN_IF_ERROR(check_quantization_strides(ws, batch, n, k, qs, batch, n, k));
  if (batch == 0 || n == 0) return FP8QUANT_SUCCESS;

  // Pointers: present, aligned, outputs sharing no byte with the inputs or with each other
  const int64_t row_blocks = ceil_div(n, kBlock), col_blocks = ceil_div(k, kBlock);
  const int64_t scale_bytes = batch * row_blocks * col_blocks * 4;
  FP8QUANT_RETURN_IF_ERROR(check_quantization_pointers(ws, qs, scale, scale_bytes));
  if (requantize) {
    FP8QUANT_CHECK_ARG(w_scale != nullptr, "w_scale", "must not be null");
    FP8QUANT_CHECK_ARG(reinterpret_cast<uintptr_t>(w_scale) % 4 == 0, "w_scale", "must be 4-byte aligned");
    FP8QUANT_RETURN_IF_ERROR(check_apart("q", q, qs.bytes, "w_scale", w_scale, scale_bytes));
    FP8QUANT_RETURN_IF_ERROR(check_apart("scale", scale, scale_bytes, "w_scale", w_scale, scale_bytes));
  }

  // 16-byte accesses need every row (pointer, strides and k) on 16-byte boundaries of both
  const int64_t vec = 16 / elem;
  const bool w16 = aligned16(w) && ws.row_stride % vec == 0 && ws.batch_stride % vec == 0 && k % vec == 0;
  const bool q16 = reinterpret_cast<uintptr_t>(q) % vec == 0 && qs.row_stride % vec == 0 && qs.batch_stride % vec == 0;
  fp8quant::BlockQuantProblem problem{};
  problem.w = w;
  problem.w_scale = w_scale;
  problem.q = q;
  problem.scale = scale;
  problem.w_batch_stride = ws.batch_stride;
  problem.w_row_stride = ws.row_stride;
  problem.q_batch_stride = qs.batch_stride;
  problem.q_row_stride = qs.row_stride;
  problem.scale_batch_stride = row_blocks * col_blocks;
  problem.batch = static_cast<int32_t>(batch);
  problem.n = static_cast<int32_t>(n);
  problem.k = static_cast<int32_t>(k);
  problem.row_blocks = static_cast<int32_t>(row_blocks);
  problem.col_blocks = static_cast<int32_t>(col_blocks);
  problem.eps = eps;
  problem.dtype = dtype;
  problem.ue8m0 = ue8m0;
  problem.aligned = w16 && q16;
  problem.pdl = fp8quant::pdl_enabled();

  return fp8quant::launch_for_arch(problem, stream, fp8quant::sm90::per_block_quant, fp8quant::sm100::per_block_quant);
}

}  // namespace

extern "C" {

fp8quant_status_t fp8quant_per_block_quant(const void* w, fp8quant_dtype_t w_dtype, int64_t batch, int64_t n, int64_t k,
                                           int64_t w_batch_stride, int64_t w_row_stride, void* q,
                                           int64_t q_batch_stride, int64_t q_row_stride, float* scale, int64_t block_n,
                                           int64_t block_k, int ue8m0, float eps, cudaStream_t stream) {
  const int64_t elem = dtype_size(w_dtype);
  FP8QUANT_CHECK_ARG(elem != 0, "w_dtype",
                     "unsupported input dtype " + std::to_string(w_dtype) + " (FLOAT32, FLOAT16 or BFLOAT16)");
  return quantize_blocks(w, elem, w_dtype, false, nullptr, batch, n, k, w_batch_stride, w_row_stride, q, q_batch_stride,
                         q_row_stride, scale, block_n, block_k, ue8m0 != 0, eps, stream);
}

fp8quant_status_t fp8quant_requantize_ue8m0(const void* w, const float* w_scale, int64_t batch, int64_t n, int64_t k,
                                            int64_t w_batch_stride, int64_t w_row_stride, void* q,
                                            int64_t q_batch_stride, int64_t q_row_stride, float* scale, int64_t block_n,
                                            int64_t block_k, float eps, cudaStream_t stream) {
  return quantize_blocks(w, 1, FP8QUANT_DTYPE_BFLOAT16, true, w_scale, batch, n, k, w_batch_stride, w_row_stride, q,
                         q_batch_stride, q_row_stride, scale, block_n, block_k, true, eps, stream);
}

}  // extern "C"
