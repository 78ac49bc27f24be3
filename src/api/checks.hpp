// Argument checks every C API function shares: element sizes, eps, scale geometry, and the
// strided [batch, rows, cols] tensors (an input read, a row-major output written) with their
// spans and overlaps. Each check records a message naming the argument (FP8QUANT_CHECK_ARG).
//
// One rule for every function (fp8quant/common.h): the values, strides included, are checked on
// every call; the pointers only where the call reads or writes through them, so an empty call
// (nothing launched) returns after the value checks and before any pointer check.
#pragma once

#include <cstdint>
#include <string>

#include "fp8quant/common.h"
#include "fp8quant/quant.h"

namespace fp8quant::api {

// Bytes of one element of `dtype`; 0 for an unknown dtype.
int64_t dtype_size(fp8quant_dtype_t dtype);

bool aligned16(const void* ptr);

// A float as the shortest text that reads back as the same value ("1e-45", "1.1754944e-38").
std::string float_text(float v);

// `a` ([a, a + a_bytes)) shares no byte with `b`; otherwise "<a_name>: overlaps <b_name>".
fp8quant_status_t check_apart(const char* a_name, const void* a, int64_t a_bytes, const char* b_name, const void* b,
                              int64_t b_bytes);

// eps (the argument `name`) is finite and at least FLT_MIN: below it eps / 448 rounds to 0 and
// an all-zero group or block divides 0 by 0.
fp8quant_status_t check_eps(float eps, const char* name = "eps");

// A [batch, rows, cols] tensor with a contiguous last dimension, its row and batch strides in
// elements of `elem` bytes, and the names of its arguments ("x", "x_row_stride", ...).
struct Operand {
  const char* name;
  const char* row_stride_name;
  const char* batch_stride_name;
  const void* ptr;
  int64_t elem;
  int64_t batch_stride;  // as given; normalized by the checks below
  int64_t row_stride;
  int64_t bytes = 0;  // set by the checks: first element to past the last
};

// The stride checks below never look at t.ptr. Strides of dimensions of size 0 or 1 are never
// stepped over: any value is accepted and set to 0; a tensor with no element spans 0 bytes.

// An input `t` ([batch, rows, cols], read): strides >= 0 (rows and batches may overlap or
// repeat), span within 2^63 bytes; t.bytes set.
fp8quant_status_t check_input(Operand& t, int64_t batch, int64_t rows, int64_t cols);

// A row-major output `t` ([batch, rows, cols], written): rows and batches apart, span within
// 2^63 bytes; t.bytes set.
fp8quant_status_t check_output(Operand& t, int64_t batch, int64_t rows, int64_t cols);

// The strides of a quantization of `in` ([in_batch, in_rows, in_cols], read: x's own rows, or
// two halves of a row, tokens scattered, ...) into `q` ([batch, rows, cols], row-major, written):
// check_input and check_output. Every call, an empty one included.
fp8quant_status_t check_quantization_strides(Operand& in, int64_t in_batch, int64_t in_rows, int64_t in_cols,
                                             Operand& q, int64_t batch, int64_t rows, int64_t cols);

// The pointers of a quantization that has work (after check_quantization_strides): non-null,
// `in` aligned to its element and `scale` (`scale_bytes` from its pointer) to 4 bytes, and the
// outputs sharing no byte with the input or each other ("q: overlaps x").
fp8quant_status_t check_quantization_pointers(const Operand& in, const Operand& q, const void* scale,
                                              int64_t scale_bytes);

// fp8quant_scale_shape() with the caller's name for its rows (`m_name`: "n" for the weight
// scales): sizes >= 0, and no size past 64 bits (naming m_name for the rows and groups of one
// batch, "batch" for their batches).
fp8quant_status_t check_scale_shape(fp8quant_scale_layout_t scale_layout, int64_t batch, int64_t m, int64_t num_groups,
                                    const char* m_name, fp8quant_scale_shape_t* shape);

}  // namespace fp8quant::api
