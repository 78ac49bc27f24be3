// C API of the MoE kernels: validate every argument, then dispatch on the device's architecture.
#include <cstdint>
#include <string>

#include "api/checks.hpp"
#include "common/device.hpp"
#include "common/error.hpp"
#include "fp8quant/moe.h"
#include "kernels/moe_combine.hpp"

namespace {

using namespace fp8quant::api;

constexpr int64_t kMaxSlots = 1024;                                // k: slots per token
constexpr int64_t kMaxTokens = (int64_t{1} << 31) - 1;            // tokens go on grid.x
constexpr int64_t kMaxHidden = (int64_t{1} << 31) - 1 - 65536;    // h is int32 on the device

}  // namespace

extern "C" {

fp8quant_status_t fp8quant_moe_combine(const void* y, fp8quant_dtype_t y_dtype, int64_t y_rows, int64_t h,
                                       int64_t y_row_stride, const int32_t* rows, const float* weights, int64_t t,
                                       int64_t k, void* out, int64_t out_row_stride, cudaStream_t stream) {
  using std::to_string;
  const int64_t elem = dtype_size(y_dtype);

  // Values
  FP8QUANT_CHECK_ARG(elem != 0, "y_dtype", "unsupported dtype " + to_string(y_dtype) +
                                               " (FLOAT32, FLOAT16 or BFLOAT16)");
  FP8QUANT_CHECK_ARG(y_rows >= 0, "y_rows", "must be >= 0, got " + to_string(y_rows));
  FP8QUANT_CHECK_ARG(h > 0 && h <= kMaxHidden, "h", "must be in [1, " + to_string(kMaxHidden) + "], got " + to_string(h));
  FP8QUANT_CHECK_ARG(t >= 0 && t <= kMaxTokens, "t", "must be in [0, " + to_string(kMaxTokens) + "], got " + to_string(t));
  FP8QUANT_CHECK_ARG(k >= 1 && k <= kMaxSlots, "k", "must be in [1, " + to_string(kMaxSlots) + "], got " + to_string(k));
  if (t == 0) return FP8QUANT_SUCCESS;  // empty: nothing to launch

  // Buffers: y read (rows may repeat), out written (rows apart), rows and weights contiguous
  FP8QUANT_CHECK_ARG(y != nullptr || y_rows == 0, "y", "must not be null");
  FP8QUANT_CHECK_ARG(reinterpret_cast<uintptr_t>(y) % elem == 0, "y",
                     "must be aligned to its element size (" + to_string(elem) + " bytes)");
  FP8QUANT_CHECK_ARG(rows != nullptr && reinterpret_cast<uintptr_t>(rows) % 4 == 0, "rows",
                     "must be a non-null, 4-byte aligned int32 pointer");
  FP8QUANT_CHECK_ARG(weights != nullptr && reinterpret_cast<uintptr_t>(weights) % 4 == 0, "weights",
                     "must be a non-null, 4-byte aligned float pointer");
  FP8QUANT_CHECK_ARG(out != nullptr && reinterpret_cast<uintptr_t>(out) % elem == 0, "out",
                     "must be non-null and aligned to its element size (" + to_string(elem) + " bytes)");
  Operand ys{"y", "y_row_stride", "y_batch_stride", y, elem, 0, y_row_stride};
  Operand os{"out", "out_row_stride", "out_batch_stride", out, elem, 0, out_row_stride};
  if (y_rows > 0) FP8QUANT_RETURN_IF_ERROR(check_input(ys, 1, y_rows, h));
  FP8QUANT_RETURN_IF_ERROR(check_output(os, 1, t, h));
  const int64_t slot_bytes = t * k * 4;  // t and k are bounded: no overflow
  FP8QUANT_RETURN_IF_ERROR(check_apart("out", out, os.bytes, "y", y, ys.bytes));
  FP8QUANT_RETURN_IF_ERROR(check_apart("out", out, os.bytes, "rows", rows, slot_bytes));
  FP8QUANT_RETURN_IF_ERROR(check_apart("out", out, os.bytes, "weights", weights, slot_bytes));

  const int64_t vec = 16 / elem;
  fp8quant::CombineProblem problem{};
  problem.y = y;
  problem.rows = rows;
  problem.weights = weights;
  problem.out = out;
  problem.y_row_stride = ys.row_stride;
  problem.out_row_stride = os.row_stride;
  problem.y_rows = y_rows;
  problem.t = t;
  problem.k = static_cast<int32_t>(k);
  problem.h = static_cast<int32_t>(h);
  problem.col_blocks = static_cast<int32_t>((h + vec * 128 - 1) / (vec * 128));
  problem.dtype = y_dtype;
  problem.aligned = aligned16(y) && aligned16(out) && h % vec == 0 && ys.row_stride % vec == 0 &&
                    os.row_stride % vec == 0;
  problem.pdl = fp8quant::pdl_enabled();

  // Dispatch on the architecture
  fp8quant::DeviceInfo device{};
  FP8QUANT_RETURN_IF_ERROR(fp8quant::current_device(&device));
  int arch = 0;
  FP8QUANT_RETURN_IF_ERROR(fp8quant::kernel_arch(device, &arch));
  if (arch == 9) {
    return fp8quant::sm90::moe_combine(problem, stream);
  } else {  // 10: kernel_arch returns no other
    return fp8quant::sm100::moe_combine(problem, stream);
  }
}

}  // extern "C"
