// C API of the quantization kernels: validate every argument, then dispatch on the device's
// architecture.
#include "fp8quant/quant.h"

#include <cstdint>
#include <limits>
#include <string>

#include "api/checks.hpp"
#include "api/device.hpp"
#include "api/group_quant.hpp"
#include "common/error.hpp"
#include "kernels/per_token_group_quant.hpp"

namespace {

using namespace fp8quant::api;

constexpr int64_t kTmaRowAlign = 4;   // 16 bytes of 4-byte scales
constexpr int64_t kPack = 4;          // UE8M0 bytes per int32
constexpr int64_t kMaxBatch = 65535;  // batches go on grid.y
// Groups launched per batch are counted in int32 on the device, with a block of headroom.
constexpr int64_t kMaxUnits = std::numeric_limits<int32_t>::max() - 4096;

int64_t align_up(int64_t n, int64_t a) { return (n + a - 1) / a * a; }

bool is_layout(fp8quant_scale_layout_t layout) {
  return layout == FP8QUANT_SCALE_ROW || layout == FP8QUANT_SCALE_MN || layout == FP8QUANT_SCALE_MN_TMA ||
         layout == FP8QUANT_SCALE_PACKED_UE8M0;
}

// Geometry of a layout; arguments already checked.
fp8quant_scale_shape_t scale_geometry(fp8quant_scale_layout_t layout, int64_t batch, int64_t m, int64_t num_groups) {
  fp8quant_scale_shape_t s{};
  const bool tma = layout == FP8QUANT_SCALE_MN_TMA || layout == FP8QUANT_SCALE_PACKED_UE8M0;
  s.rows = tma ? align_up(m, kTmaRowAlign) : m;
  s.cols = layout == FP8QUANT_SCALE_PACKED_UE8M0 ? (num_groups + kPack - 1) / kPack : num_groups;
  if (layout == FP8QUANT_SCALE_ROW) {
    s.row_stride = s.cols;
    s.col_stride = 1;
  } else {
    s.row_stride = 1;
    s.col_stride = s.rows;
  }
  s.batch_stride = s.rows * s.cols;
  s.numel = s.batch_stride * batch;
  return s;
}

}  // namespace

namespace fp8quant::api {

fp8quant_status_t group_quant(const void* x, fp8quant_dtype_t x_dtype, int64_t batch, int64_t m, int64_t k,
                              int64_t x_batch_stride, int64_t x_row_stride, void* q, int64_t q_batch_stride,
                              int64_t q_row_stride, void* scale, fp8quant_scale_layout_t scale_layout, int ue8m0,
                              int64_t group_size, float eps, const GroupSource& source, cudaStream_t stream) {
  using std::to_string;
  const int64_t elem = dtype_size(x_dtype);
  const char* k_name = source.k_name;
  const char* m_name = source.m_name;

  // Values
  FP8QUANT_CHECK_ARG(elem != 0, "x_dtype",
                     "unsupported input dtype " + to_string(x_dtype) + " (FLOAT32, FLOAT16 or BFLOAT16)");
  FP8QUANT_CHECK_ARG(is_layout(scale_layout), "scale_layout", "unknown scale layout " + to_string(scale_layout));
  FP8QUANT_CHECK_ARG(scale_layout != FP8QUANT_SCALE_PACKED_UE8M0 || ue8m0, "ue8m0",
                     "must be nonzero with FP8QUANT_SCALE_PACKED_UE8M0 (packed scales are UE8M0)");
  FP8QUANT_CHECK_ARG(group_size == 32 || group_size == 64 || group_size == 128, "group_size",
                     "must be 32, 64 or 128, got " + to_string(group_size));
  FP8QUANT_CHECK_ARG(k > 0 && k % group_size == 0, k_name,
                     "must be a positive multiple of group_size (" + to_string(group_size) + "), got " + to_string(k));
  FP8QUANT_CHECK_ARG(batch >= 0 && batch <= kMaxBatch, source.batch_name,
                     "must be in [0, " + to_string(kMaxBatch) + "], got " + to_string(batch));
  FP8QUANT_CHECK_ARG(m >= 0, m_name, "must be >= 0, got " + to_string(m));
  FP8QUANT_RETURN_IF_ERROR(check_eps(eps));

  // Geometry (m and num_groups are bounded first, so no product below overflows)
  const int64_t num_groups = k / group_size;
  FP8QUANT_CHECK_ARG(
      num_groups <= kMaxUnits, k_name,
      std::string(k_name) + " / group_size (" + to_string(num_groups) + ") must be at most " + to_string(kMaxUnits));
  FP8QUANT_CHECK_ARG(m <= kMaxUnits, m_name, "must be at most " + to_string(kMaxUnits) + ", got " + to_string(m));
  const fp8quant_scale_shape_t shape = scale_geometry(scale_layout, 1, m, num_groups);
  const int64_t slots = scale_layout == FP8QUANT_SCALE_PACKED_UE8M0 ? shape.cols * kPack : num_groups;
  const int32_t tile = fp8quant::team_row_tile(fp8quant::scale_order(scale_layout), source.kind);
  const int64_t units = fp8quant::team_units(tile, shape.rows, slots);
  // k is what overflows when one row (one tile of rows, padding included) already needs too many
  const int64_t row_units = fp8quant::team_units(tile, scale_geometry(scale_layout, 1, 1, num_groups).rows, slots);
  FP8QUANT_CHECK_ARG(units <= kMaxUnits, row_units > kMaxUnits ? k_name : m_name,
                     "one batch needs " + to_string(units) + " group slots (" + to_string(shape.rows) +
                         " scale rows, padding included, of " + to_string(slots) + " slots), more than the limit of " +
                         to_string(kMaxUnits));
  FP8QUANT_RETURN_IF_ERROR(check_scatter_padding(source, num_groups));

  // Strides and spans, every call; then an empty one is done: nothing read, written or launched
  Operand xs{"x", "x_row_stride", "x_batch_stride", x, elem, x_batch_stride, x_row_stride};
  Operand qs{"q", "q_row_stride", "q_batch_stride", q, 1, q_batch_stride, q_row_stride};
  bool empty = false;
  FP8QUANT_RETURN_IF_ERROR(check_source_strides(source, xs, qs, batch, m, k, k, &empty));
  if (empty) return FP8QUANT_SUCCESS;

  // Pointers: present, aligned, outputs sharing no byte with the inputs or with each other
  const int64_t scale_bytes = shape.batch_stride * batch * 4;
  FP8QUANT_RETURN_IF_ERROR(check_quantization_pointers(xs, qs, scale, scale_bytes));
  FP8QUANT_RETURN_IF_ERROR(check_index_inputs(source.indices, 3, q, qs.bytes, scale, scale_bytes));

  // Strides that are never stepped over do not constrain the vectorized path
  const int64_t x_vec = 16 / elem;  // elements in 16 bytes
  const bool x_strides16 = xs.row_stride % x_vec == 0 && xs.batch_stride % x_vec == 0 && source.up_offset % x_vec == 0;
  const bool q_strides16 = qs.row_stride % 16 == 0 && qs.batch_stride % 16 == 0;
  fp8quant::QuantProblem problem{};
  set_group_operands(problem, xs, q, qs, batch, m, num_groups, shape.rows, slots);
  problem.scale = scale;
  problem.scale_batch_stride = shape.batch_stride;
  problem.units = static_cast<int32_t>(units);
  problem.tile_units = fp8quant::FastDivisor(static_cast<uint32_t>(tile * slots));
  problem.eps = eps;
  problem.dtype = x_dtype;
  problem.layout = scale_layout;
  problem.group_size = static_cast<int32_t>(group_size);
  problem.ue8m0 = ue8m0 != 0;
  problem.aligned = aligned16(x) && aligned16(q) && x_strides16 && q_strides16;
  problem.pdl = fp8quant::pdl_enabled();
  copy_source(problem, source);
  if (source.kind == fp8quant::QuantSource::kScatter) {
    // Teams walk the tokens; q and the scales keep the destination's geometry
    const int64_t token_units = fp8quant::team_units(tile, source.in_rows, slots);
    FP8QUANT_RETURN_IF_ERROR(walk_tokens(problem, source, batch, m, shape.rows, token_units, kMaxUnits));
  }

  return fp8quant::launch_for_arch_with_sm_count(problem, stream, fp8quant::sm90::per_token_group_quant,
                                                 fp8quant::sm100::per_token_group_quant);
}

fp8quant_status_t check_scale_shape(fp8quant_scale_layout_t scale_layout, int64_t batch, int64_t m, int64_t num_groups,
                                    const char* m_name, fp8quant_scale_shape_t* shape) {
  using std::to_string;
  FP8QUANT_CHECK_ARG(is_layout(scale_layout), "scale_layout", "unknown scale layout " + to_string(scale_layout));
  FP8QUANT_CHECK_ARG(batch >= 0, "batch", "must be >= 0, got " + to_string(batch));
  FP8QUANT_CHECK_ARG(m >= 0, m_name, "must be >= 0, got " + to_string(m));
  FP8QUANT_CHECK_ARG(num_groups >= 0, "num_groups", "must be >= 0, got " + to_string(num_groups));
  constexpr int64_t kLimit = int64_t{1} << 56;
  FP8QUANT_CHECK_ARG(m < kLimit && num_groups < kLimit / (m + kTmaRowAlign), m_name,
                     "the scales of this many rows and groups overflow 64-bit sizes");
  FP8QUANT_CHECK_ARG(batch == 0 || (m + kTmaRowAlign) * num_groups < kLimit / batch, "batch",
                     "the scales of this many batches overflow 64-bit sizes");
  *shape = scale_geometry(scale_layout, batch, m, num_groups);
  return FP8QUANT_SUCCESS;
}

}  // namespace fp8quant::api

extern "C" {

fp8quant_status_t fp8quant_scale_shape(fp8quant_scale_layout_t scale_layout, int64_t batch, int64_t m,
                                       int64_t num_groups, fp8quant_scale_shape_t* shape) {
  FP8QUANT_CHECK_ARG(shape != nullptr, "shape", "must not be null");
  return fp8quant::api::check_scale_shape(scale_layout, batch, m, num_groups, "m", shape);
}

fp8quant_status_t fp8quant_per_token_group_quant(const void* x, fp8quant_dtype_t x_dtype, int64_t batch, int64_t m,
                                                 int64_t k, int64_t x_batch_stride, int64_t x_row_stride, void* q,
                                                 int64_t q_batch_stride, int64_t q_row_stride, void* scale,
                                                 fp8quant_scale_layout_t scale_layout, int ue8m0, int64_t group_size,
                                                 float eps, cudaStream_t stream) {
  return fp8quant::api::group_quant(x, x_dtype, batch, m, k, x_batch_stride, x_row_stride, q, q_batch_stride,
                                    q_row_stride, scale, scale_layout, ue8m0, group_size, eps, {}, stream);
}

}  // extern "C"
