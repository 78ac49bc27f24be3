// Argument checks every C API function shares (checks.hpp).
#include "api/checks.hpp"

#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <limits>

#include "common/error.hpp"

namespace fp8quant::api {
namespace {

// Extent of a strided tensor, summed dimension by dimension with overflow checks: add(n, step)
// adds n steps of `step`, times(s) scales the total. Each returns false on overflow.
struct Span {
  int64_t size = 0;
  bool add(int64_t n, int64_t step) {
    int64_t more = 0;
    return !__builtin_mul_overflow(n, step, &more) && !__builtin_add_overflow(size, more, &size);
  }
  bool times(int64_t s) { return !__builtin_mul_overflow(size, s, &size); }
};

// One batch's rows of `t`, in elements, into `span` (0 without rows): refused when they span
// more than 2^63 bytes.
fp8quant_status_t span_rows(const Operand& t, int64_t rows, int64_t cols, Span* span) {
  if (rows == 0) return FP8QUANT_SUCCESS;
  FP8QUANT_CHECK_ARG(span->add(rows - 1, t.row_stride) && span->add(1, cols) && Span(*span).times(t.elem),
                     t.row_stride_name,
                     std::string("is too large: the rows of ") + t.name + " span more than 2^63 bytes");
  return FP8QUANT_SUCCESS;
}

// All batches of `t` from one batch's `span` (elements): its size in bytes into t.bytes (0 for
// no element), refused past 2^63 bytes.
fp8quant_status_t span_batches(Operand& t, int64_t batch, Span* span) {
  if (batch == 0 || span->size == 0) {
    t.bytes = 0;
    return FP8QUANT_SUCCESS;
  }
  FP8QUANT_CHECK_ARG(span->add(batch - 1, t.batch_stride) && span->times(t.elem), t.batch_stride_name,
                     std::string("is too large: the batches of ") + t.name + " span more than 2^63 bytes");
  t.bytes = span->size;
  return FP8QUANT_SUCCESS;
}

// Strides of size-1 dimensions are never stepped over: treat them as 0.
void normalize(Operand& t, int64_t batch, int64_t rows) {
  if (rows <= 1) t.row_stride = 0;
  if (batch <= 1) t.batch_stride = 0;
}

}  // namespace

// A row-major output: rows and batches must not overlap, span within 2^63 bytes.
fp8quant_status_t check_output(Operand& t, int64_t batch, int64_t rows, int64_t cols) {
  using std::to_string;
  const int64_t row_given = t.row_stride, batch_given = t.batch_stride;
  normalize(t, batch, rows);
  FP8QUANT_CHECK_ARG(rows <= 1 || t.row_stride >= cols, t.row_stride_name,
                     std::string("rows of ") + t.name + " must not overlap: need >= " + to_string(cols) + ", got " +
                         to_string(row_given));
  Span span{};
  FP8QUANT_RETURN_IF_ERROR(span_rows(t, rows, cols, &span));
  FP8QUANT_CHECK_ARG(batch <= 1 || t.batch_stride >= span.size, t.batch_stride_name,
                     std::string("batches of ") + t.name + " must not overlap: need >= " + to_string(span.size) +
                         ", got " + to_string(batch_given));
  return span_batches(t, batch, &span);
}

// An input: strides >= 0 (rows and batches may overlap or repeat), span within 2^63 bytes.
fp8quant_status_t check_input(Operand& t, int64_t batch, int64_t rows, int64_t cols) {
  using std::to_string;
  const int64_t row_given = t.row_stride, batch_given = t.batch_stride;
  normalize(t, batch, rows);
  FP8QUANT_CHECK_ARG(t.row_stride >= 0, t.row_stride_name,
                     "must be >= 0 (rows may overlap or repeat), got " + to_string(row_given));
  FP8QUANT_CHECK_ARG(t.batch_stride >= 0, t.batch_stride_name,
                     "must be >= 0 (batches may overlap or repeat), got " + to_string(batch_given));
  Span span{};
  FP8QUANT_RETURN_IF_ERROR(span_rows(t, rows, cols, &span));
  return span_batches(t, batch, &span);
}

// `a` ([a, a + a_bytes)) shares no byte with `b`; otherwise "<a_name>: overlaps <b_name>".
fp8quant_status_t check_apart(const char* a_name, const void* a, int64_t a_bytes, const char* b_name, const void* b,
                              int64_t b_bytes) {
  const uintptr_t lo_a = reinterpret_cast<uintptr_t>(a), lo_b = reinterpret_cast<uintptr_t>(b);
  const bool shared = lo_a < lo_b + static_cast<uintptr_t>(b_bytes) && lo_b < lo_a + static_cast<uintptr_t>(a_bytes);
  FP8QUANT_CHECK_ARG(!shared, a_name, std::string("overlaps ") + b_name);
  return FP8QUANT_SUCCESS;
}

int64_t dtype_size(fp8quant_dtype_t dtype) {
  switch (dtype) {
    case FP8QUANT_DTYPE_FLOAT32:
      return 4;
    case FP8QUANT_DTYPE_FLOAT16:
      return 2;
    case FP8QUANT_DTYPE_BFLOAT16:
      return 2;
  }
  return 0;
}

bool aligned16(const void* ptr) { return reinterpret_cast<uintptr_t>(ptr) % 16 == 0; }

std::string float_text(float v) {
  char buf[32];
  for (int digits = 1; digits <= 9; ++digits) {
    std::snprintf(buf, sizeof(buf), "%.*g", digits, static_cast<double>(v));
    if (std::strtof(buf, nullptr) == v || v != v) break;
  }
  return buf;
}

fp8quant_status_t check_eps(float eps, const char* name) {
  FP8QUANT_CHECK_ARG(std::isfinite(eps) && eps >= std::numeric_limits<float>::min(), name,
                     "must be finite and at least the smallest normal float32 (" +
                         float_text(std::numeric_limits<float>::min()) + "), got " + float_text(eps));
  return FP8QUANT_SUCCESS;
}

fp8quant_status_t check_quantization_strides(Operand& in, int64_t in_batch, int64_t in_rows, int64_t in_cols,
                                             Operand& q, int64_t batch, int64_t rows, int64_t cols) {
  FP8QUANT_RETURN_IF_ERROR(check_input(in, in_batch, in_rows, in_cols));
  return check_output(q, batch, rows, cols);
}

fp8quant_status_t check_quantization_pointers(const Operand& in, const Operand& q, const void* scale,
                                              int64_t scale_bytes) {
  FP8QUANT_CHECK_ARG(in.ptr != nullptr, in.name, "must not be null");
  FP8QUANT_CHECK_ARG(q.ptr != nullptr, q.name, "must not be null");
  FP8QUANT_CHECK_ARG(scale != nullptr, "scale", "must not be null");
  FP8QUANT_CHECK_ARG(reinterpret_cast<uintptr_t>(in.ptr) % in.elem == 0, in.name,
                     "must be aligned to its element size (" + std::to_string(in.elem) + " bytes)");
  FP8QUANT_CHECK_ARG(reinterpret_cast<uintptr_t>(scale) % 4 == 0, "scale", "must be 4-byte aligned");
  FP8QUANT_RETURN_IF_ERROR(check_apart(q.name, q.ptr, q.bytes, in.name, in.ptr, in.bytes));
  FP8QUANT_RETURN_IF_ERROR(check_apart("scale", scale, scale_bytes, in.name, in.ptr, in.bytes));
  return check_apart("scale", scale, scale_bytes, q.name, q.ptr, q.bytes);
}

}  // namespace fp8quant::api
