// C API of the quantization kernels: validate every argument, then dispatch on the device's
// architecture.
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <limits>
#include <string>

#include "common/device.hpp"
#include "common/error.hpp"
#include "fp8quant/quant.h"
#include "kernels/per_token_group_quant.hpp"

namespace {

constexpr int64_t kTmaRowAlign = 4;  // 16 bytes of 4-byte scales
constexpr int64_t kPack = 4;         // UE8M0 bytes per int32
constexpr int64_t kMaxBatch = 65535; // batches go on grid.y
// Groups launched per batch are counted in int32 on the device, with a block of headroom.
constexpr int64_t kMaxUnits = std::numeric_limits<int32_t>::max() - 4096;

int64_t align_up(int64_t n, int64_t a) { return (n + a - 1) / a * a; }

bool is_layout(fp8quant_scale_layout_t layout) {
  return layout == FP8QUANT_SCALE_ROW || layout == FP8QUANT_SCALE_MN ||
         layout == FP8QUANT_SCALE_MN_TMA || layout == FP8QUANT_SCALE_PACKED_UE8M0;
}

int64_t dtype_size(fp8quant_dtype_t dtype) {
  switch (dtype) {
    case FP8QUANT_DTYPE_FLOAT32: return 4;
    case FP8QUANT_DTYPE_FLOAT16: return 2;
    case FP8QUANT_DTYPE_BFLOAT16: return 2;
  }
  return 0;
}

bool aligned16(const void* ptr) { return reinterpret_cast<uintptr_t>(ptr) % 16 == 0; }

// A float as the shortest text that reads back as the same value ("1e-45", "1.17549435e-38").
std::string float_text(float v) {
  char buf[32];
  for (int digits = 1; digits <= 9; ++digits) {
    std::snprintf(buf, sizeof(buf), "%.*g", digits, static_cast<double>(v));
    if (std::strtof(buf, nullptr) == v || v != v) break;
  }
  return buf;
}

// Extent of a strided tensor, from its first element to past its last, summed dimension by
// dimension with overflow checks: add(n, step) adds n steps of `step`, times(s) scales the total.
// Each returns false on overflow.
struct Span {
  int64_t size = 0;
  bool add(int64_t n, int64_t step) {
    int64_t more = 0;
    return !__builtin_mul_overflow(n, step, &more) && !__builtin_add_overflow(size, more, &size);
  }
  bool times(int64_t s) { return !__builtin_mul_overflow(size, s, &size); }
};

// Whether [a, a + a_bytes) and [b, b + b_bytes) share a byte.
bool overlap(const void* a, int64_t a_bytes, const void* b, int64_t b_bytes) {
  const uintptr_t lo_a = reinterpret_cast<uintptr_t>(a), lo_b = reinterpret_cast<uintptr_t>(b);
  return lo_a < lo_b + static_cast<uintptr_t>(b_bytes) && lo_b < lo_a + static_cast<uintptr_t>(a_bytes);
}

// Geometry of a layout; arguments already checked.
fp8quant_scale_shape_t scale_geometry(fp8quant_scale_layout_t layout, int64_t batch, int64_t m,
                                      int64_t num_groups) {
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

extern "C" {

fp8quant_status_t fp8quant_scale_shape(fp8quant_scale_layout_t layout, int64_t batch, int64_t m,
                                       int64_t num_groups, fp8quant_scale_shape_t* shape) {
  FP8QUANT_CHECK_ARG(shape != nullptr, "shape", "must not be null");
  FP8QUANT_CHECK_ARG(is_layout(layout), "layout", "unknown scale layout " + std::to_string(layout));
  FP8QUANT_CHECK_ARG(batch >= 0, "batch", "must be >= 0, got " + std::to_string(batch));
  FP8QUANT_CHECK_ARG(m >= 0, "m", "must be >= 0, got " + std::to_string(m));
  FP8QUANT_CHECK_ARG(num_groups >= 0, "num_groups", "must be >= 0, got " + std::to_string(num_groups));
  constexpr int64_t kLimit = int64_t{1} << 56;
  FP8QUANT_CHECK_ARG(m < kLimit && num_groups < kLimit / (m + kTmaRowAlign) &&
                         (batch == 0 || (m + kTmaRowAlign) * num_groups < kLimit / batch),
                     "m", "the scales of this many rows and groups overflow 64-bit sizes");
  *shape = scale_geometry(layout, batch, m, num_groups);
  return FP8QUANT_SUCCESS;
}

fp8quant_status_t fp8quant_per_token_group_quant(
    const void* x, fp8quant_dtype_t x_dtype, int64_t batch, int64_t m, int64_t k,
    int64_t x_batch_stride, int64_t x_row_stride, void* q, int64_t q_batch_stride,
    int64_t q_row_stride, void* scale, fp8quant_scale_layout_t scale_layout, int ue8m0,
    int64_t group_size, float eps, cudaStream_t stream) {
  using std::to_string;
  const int64_t elem = dtype_size(x_dtype);

  // Values
  FP8QUANT_CHECK_ARG(elem != 0, "x_dtype", "unsupported input dtype " + to_string(x_dtype) +
                                               " (FLOAT32, FLOAT16 or BFLOAT16)");
  FP8QUANT_CHECK_ARG(is_layout(scale_layout), "scale_layout",
                     "unknown scale layout " + to_string(scale_layout));
  FP8QUANT_CHECK_ARG(scale_layout != FP8QUANT_SCALE_PACKED_UE8M0 || ue8m0, "ue8m0",
                     "must be nonzero with FP8QUANT_SCALE_PACKED_UE8M0 (packed scales are UE8M0)");
  FP8QUANT_CHECK_ARG(group_size == 32 || group_size == 64 || group_size == 128, "group_size",
                     "must be 32, 64 or 128, got " + to_string(group_size));
  FP8QUANT_CHECK_ARG(k > 0 && k % group_size == 0, "k",
                     "must be a positive multiple of group_size (" + to_string(group_size) +
                         "), got " + to_string(k));
  FP8QUANT_CHECK_ARG(batch >= 0 && batch <= kMaxBatch, "batch",
                     "must be in [0, " + to_string(kMaxBatch) + "], got " + to_string(batch));
  FP8QUANT_CHECK_ARG(m >= 0, "m", "must be >= 0, got " + to_string(m));
  // Below the smallest normal float, eps / 448 rounds to 0 and an all-zero group divides 0 by 0
  FP8QUANT_CHECK_ARG(std::isfinite(eps) && eps >= std::numeric_limits<float>::min(), "eps",
                     "must be finite and at least the smallest normal float32 (" +
                         float_text(std::numeric_limits<float>::min()) + "), got " + float_text(eps));
  if (batch == 0 || m == 0) return FP8QUANT_SUCCESS;  // empty: nothing to launch

  // Geometry (m and num_groups are bounded first, so no product below overflows)
  const int64_t num_groups = k / group_size;
  FP8QUANT_CHECK_ARG(m <= kMaxUnits && num_groups <= kMaxUnits, "m",
                     "m (" + to_string(m) + ") and k / group_size (" + to_string(num_groups) +
                         ") must each be at most " + to_string(kMaxUnits));
  const fp8quant_scale_shape_t shape = scale_geometry(scale_layout, 1, m, num_groups);
  const int64_t slots = scale_layout == FP8QUANT_SCALE_PACKED_UE8M0 ? shape.cols * kPack : num_groups;
  const int64_t units = fp8quant::team_units(scale_layout, shape.rows, slots);
  FP8QUANT_CHECK_ARG(units <= kMaxUnits, "m",
                     "one batch needs " + to_string(units) + " group slots (" + to_string(shape.rows) +
                         " scale rows, padding included, of " + to_string(slots) +
                         " slots), more than the limit of " + to_string(kMaxUnits));

  // Buffers
  FP8QUANT_CHECK_ARG(x != nullptr, "x", "must not be null");
  FP8QUANT_CHECK_ARG(q != nullptr, "q", "must not be null");
  FP8QUANT_CHECK_ARG(scale != nullptr, "scale", "must not be null");
  FP8QUANT_CHECK_ARG(reinterpret_cast<uintptr_t>(x) % elem == 0, "x",
                     "must be aligned to its element size (" + to_string(elem) + " bytes)");
  FP8QUANT_CHECK_ARG(reinterpret_cast<uintptr_t>(scale) % 4 == 0, "scale", "must be 4-byte aligned");

  // Strides: those of a size-1 dimension are never stepped over, so any value is accepted there
  // (DLPack producers may report them as 0 or negative) and treated as 0
  const int64_t x_rows = m > 1 ? x_row_stride : 0;
  const int64_t x_batches = batch > 1 ? x_batch_stride : 0;
  const int64_t q_rows = m > 1 ? q_row_stride : 0;
  const int64_t q_batches = batch > 1 ? q_batch_stride : 0;
  FP8QUANT_CHECK_ARG(x_rows >= 0, "x_row_stride",
                     "must be >= 0 (rows may overlap or repeat), got " + to_string(x_row_stride));
  FP8QUANT_CHECK_ARG(x_batches >= 0, "x_batch_stride",
                     "must be >= 0 (batches may overlap or repeat), got " + to_string(x_batch_stride));
  Span x_span{}, q_span{};  // x in elements (then bytes), q in bytes
  FP8QUANT_CHECK_ARG(x_span.add(m - 1, x_rows) && x_span.add(1, k) && Span(x_span).times(elem), "x_row_stride",
                     "is too large: the rows of x span more than 2^63 bytes");
  FP8QUANT_CHECK_ARG(x_span.add(batch - 1, x_batches) && x_span.times(elem), "x_batch_stride",
                     "is too large: the batches of x span more than 2^63 bytes");
  FP8QUANT_CHECK_ARG(m == 1 || q_rows >= k, "q_row_stride",
                     "rows of q must not overlap: need >= k (" + to_string(k) + "), got " + to_string(q_row_stride));
  FP8QUANT_CHECK_ARG(q_span.add(m - 1, q_rows) && q_span.add(1, k), "q_row_stride",
                     "is too large: the rows of q span more than 2^63 bytes");
  const int64_t q_batch_bytes = q_span.size;  // one batch of q
  FP8QUANT_CHECK_ARG(batch == 1 || q_batches >= q_batch_bytes, "q_batch_stride",
                     "batches of q must not overlap: need >= " + to_string(q_batch_bytes) + ", got " +
                         to_string(q_batch_stride));
  FP8QUANT_CHECK_ARG(q_span.add(batch - 1, q_batches), "q_batch_stride",
                     "is too large: the batches of q span more than 2^63 bytes");

  // Outputs share no byte with the input or with each other
  const int64_t scale_bytes = shape.batch_stride * batch * 4;
  FP8QUANT_CHECK_ARG(!overlap(q, q_span.size, x, x_span.size), "q", "overlaps x");
  FP8QUANT_CHECK_ARG(!overlap(scale, scale_bytes, x, x_span.size), "scale", "overlaps x");
  FP8QUANT_CHECK_ARG(!overlap(scale, scale_bytes, q, q_span.size), "scale", "overlaps q");

  // Strides that are never stepped over do not constrain the vectorized path
  const int64_t x_vec = 16 / elem;  // elements in 16 bytes
  const bool x_strides16 = x_rows % x_vec == 0 && x_batches % x_vec == 0;
  const bool q_strides16 = q_rows % 16 == 0 && q_batches % 16 == 0;
  fp8quant::QuantProblem problem{};
  problem.x = x;
  problem.q = q;
  problem.scale = scale;
  problem.x_batch_stride = x_batches;
  problem.x_row_stride = x_rows;
  problem.q_batch_stride = q_batches;
  problem.q_row_stride = q_rows;
  problem.scale_batch_stride = shape.batch_stride;
  problem.batch = static_cast<int32_t>(batch);
  problem.m = static_cast<int32_t>(m);
  problem.num_groups = static_cast<int32_t>(num_groups);
  problem.rows = static_cast<int32_t>(shape.rows);
  problem.slots = static_cast<int32_t>(slots);
  problem.units = static_cast<int32_t>(units);
  problem.tile_units = fp8quant::FastDivisor(static_cast<uint32_t>(fp8quant::row_tile(scale_layout) * slots));
  problem.eps = eps;
  problem.dtype = x_dtype;
  problem.layout = scale_layout;
  problem.group_size = static_cast<int32_t>(group_size);
  problem.ue8m0 = ue8m0 != 0;
  problem.aligned = aligned16(x) && aligned16(q) && x_strides16 && q_strides16;
  problem.pdl = fp8quant::pdl_enabled();

  // Dispatch on the architecture
  fp8quant::DeviceInfo device{};
  if (const fp8quant_status_t st = fp8quant::current_device(&device); st != FP8QUANT_SUCCESS) return st;
  int arch = 0;
  if (const fp8quant_status_t st = fp8quant::kernel_arch(device, &arch); st != FP8QUANT_SUCCESS) return st;
  problem.sm_count = device.sm_count;
  if (arch == 9) {
    return fp8quant::sm90::per_token_group_quant(problem, stream);
  } else {  // 10: kernel_arch returns no other
    return fp8quant::sm100::per_token_group_quant(problem, stream);
  }
}

}  // extern "C"
