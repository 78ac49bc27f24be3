// C API of the MXFP8 quantization kernel: validate every argument, then dispatch on the device's
// architecture.
#include "fp8quant/mx.h"

#include <cstdint>
#include <limits>
#include <string>

#include "api/checks.hpp"
#include "api/device.hpp"
#include "common/error.hpp"
#include "kernels/mx_quant.hpp"

namespace {

using namespace fp8quant::api;

constexpr int64_t kMaxBatch = 65535;  // batches go on grid.y
// Scale slots per batch are counted in int32 on the device, with a block of headroom.
constexpr int64_t kMaxUnits = std::numeric_limits<int32_t>::max() - 4096;

int64_t align_up(int64_t n, int64_t a) { return (n + a - 1) / a * a; }

bool is_mx_layout(fp8quant_mx_scale_layout_t layout) {
  return layout == FP8QUANT_MX_SCALE_ROW || layout == FP8QUANT_MX_SCALE_SWIZZLED;
}

// The scale slots of one batch: (rows, slots), padding included; arguments already checked.
void mx_slots(fp8quant_mx_scale_layout_t layout, int64_t m, int64_t num_groups, int64_t* rows, int64_t* slots) {
  const bool swizzled = layout == FP8QUANT_MX_SCALE_SWIZZLED;
  *rows = swizzled ? align_up(m, 128) : m;
  *slots = swizzled ? align_up(num_groups, 4) : num_groups;
}

// The checks the two functions share: the layout, batch, m and k.
fp8quant_status_t check_mx_shape(fp8quant_mx_scale_layout_t scale_layout, int64_t batch, int64_t m, int64_t k) {
  using std::to_string;
  FP8QUANT_CHECK_ARG(is_mx_layout(scale_layout), "scale_layout", "unknown MX scale layout " + to_string(scale_layout));
  FP8QUANT_CHECK_ARG(batch >= 0 && batch <= kMaxBatch, "batch",
                     "must be in [0, " + to_string(kMaxBatch) + "], got " + to_string(batch));
  FP8QUANT_CHECK_ARG(m >= 0 && m <= kMaxUnits, "m",
                     "must be in [0, " + to_string(kMaxUnits) + "], got " + to_string(m));
  FP8QUANT_CHECK_ARG(k > 0 && k % fp8quant::kMxGroup == 0 && k / fp8quant::kMxGroup <= kMaxUnits, "k",
                     "must be a positive multiple of " + to_string(fp8quant::kMxGroup) + ", got " + to_string(k));
  int64_t rows = 0, slots = 0;
  mx_slots(scale_layout, m, k / fp8quant::kMxGroup, &rows, &slots);
  FP8QUANT_CHECK_ARG(rows * slots <= kMaxUnits, "m",
                     "one batch needs " + to_string(rows * slots) + " scale slots (" + to_string(rows) + " rows of " +
                         to_string(slots) + ", padding included), more than the limit of " + to_string(kMaxUnits));
  return FP8QUANT_SUCCESS;
}

}  // namespace

extern "C" {

fp8quant_status_t fp8quant_mx_scale_bytes(fp8quant_mx_scale_layout_t scale_layout, int64_t batch, int64_t m, int64_t k,
                                          int64_t* bytes) {
  FP8QUANT_CHECK_ARG(bytes != nullptr, "bytes", "must not be null");
  FP8QUANT_RETURN_IF_ERROR(check_mx_shape(scale_layout, batch, m, k));
  int64_t rows = 0, slots = 0;
  mx_slots(scale_layout, m, k / fp8quant::kMxGroup, &rows, &slots);
  *bytes = batch * rows * slots;
  return FP8QUANT_SUCCESS;
}

fp8quant_status_t fp8quant_mxfp8_quant(const void* x, fp8quant_dtype_t x_dtype, int64_t batch, int64_t m, int64_t k,
                                       int64_t x_batch_stride, int64_t x_row_stride, void* q, int64_t q_batch_stride,
                                       int64_t q_row_stride, void* scale, fp8quant_mx_scale_layout_t scale_layout,
                                       fp8quant_mx_recipe_t recipe, cudaStream_t stream) {
  using std::to_string;
  const int64_t elem = dtype_size(x_dtype);

  // Values
  FP8QUANT_CHECK_ARG(elem != 0, "x_dtype",
                     "unsupported input dtype " + to_string(x_dtype) + " (FLOAT32, FLOAT16 or BFLOAT16)");
  FP8QUANT_CHECK_ARG(recipe == FP8QUANT_MX_RCEIL || recipe == FP8QUANT_MX_FLOOR, "recipe",
                     "unknown MX recipe " + to_string(recipe));
  FP8QUANT_RETURN_IF_ERROR(check_mx_shape(scale_layout, batch, m, k));
  if (batch == 0 || m == 0) return FP8QUANT_SUCCESS;  // empty: nothing to launch

  // Buffers, strides and spans; outputs share no byte with the input or with each other
  const int64_t num_groups = k / fp8quant::kMxGroup;
  int64_t rows = 0, slots = 0;
  mx_slots(scale_layout, m, num_groups, &rows, &slots);
  Operand xs{"x", "x_row_stride", "x_batch_stride", x, elem, x_batch_stride, x_row_stride};
  Operand qs{"q", "q_row_stride", "q_batch_stride", q, 1, q_batch_stride, q_row_stride};
  FP8QUANT_RETURN_IF_ERROR(check_quantization_buffers(xs, qs, scale, batch * rows * slots, batch, m, k));

  // Strides that are never stepped over do not constrain the vectorized path
  const int64_t x_vec = 16 / elem;  // elements in 16 bytes
  fp8quant::MxProblem problem{};
  problem.x = x;
  problem.q = q;
  problem.scale = static_cast<uint8_t*>(scale);
  problem.x_batch_stride = xs.batch_stride;
  problem.x_row_stride = xs.row_stride;
  problem.q_batch_stride = qs.batch_stride;
  problem.q_row_stride = qs.row_stride;
  problem.scale_batch_stride = rows * slots;
  problem.batch = static_cast<int32_t>(batch);
  problem.m = static_cast<int32_t>(m);
  problem.num_groups = static_cast<int32_t>(num_groups);
  problem.rows = static_cast<int32_t>(rows);
  problem.slots = static_cast<int32_t>(slots);
  problem.units = static_cast<int32_t>(rows * slots);
  problem.row_slots = fp8quant::FastDivisor(static_cast<uint32_t>(slots));
  problem.dtype = x_dtype;
  problem.layout = scale_layout;
  problem.recipe = recipe;
  problem.aligned = aligned16(x) && aligned16(q) && xs.row_stride % x_vec == 0 && xs.batch_stride % x_vec == 0 &&
                    qs.row_stride % 16 == 0 && qs.batch_stride % 16 == 0;
  problem.pdl = fp8quant::pdl_enabled();
  return fp8quant::launch_for_arch(problem, stream, fp8quant::sm90::mxfp8_quant, fp8quant::sm100::mxfp8_quant);
}

}  // extern "C"
