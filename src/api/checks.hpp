// Argument checks every C API function shares: element sizes, eps, and the strided
// [batch, rows, cols] tensors (an input read, a row-major output written) with their spans and
// overlaps. Each check records a message naming the argument (FP8QUANT_CHECK_ARG).
#pragma once

#include <cstdint>
#include <string>

#include "fp8quant/common.h"

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

// An input `t` ([batch, rows, cols], read): strides >= 0 (rows and batches may overlap or
// repeat), span within 2^63 bytes; strides of size-1 dimensions set to 0; t.bytes set.
fp8quant_status_t check_input(Operand& t, int64_t batch, int64_t rows, int64_t cols);

// A row-major output `t` ([batch, rows, cols], written): rows and batches apart, span within
// 2^63 bytes; strides of size-1 dimensions set to 0; t.bytes set.
fp8quant_status_t check_output(Operand& t, int64_t batch, int64_t rows, int64_t cols);

// Everything about the buffers of a quantization of `in` ([batch, rows, cols], read) into `q`
// (like-shaped, row-major, written) and `scale` (`scale_bytes` from its pointer), in this order:
// non-null pointers, `in` aligned to its element and `scale` to 4 bytes; `in`'s strides (>= 0,
// rows and batches may repeat) and `q`'s (rows and batches apart), each span within 2^63 bytes;
// outputs sharing no byte with the input or each other ("q: overlaps x"). Strides of size-1
// dimensions are never stepped over: any value is accepted and set to 0 in `in` and `q`, whose
// `bytes` are set to their spans.
fp8quant_status_t check_quantization_buffers(Operand& in, Operand& q, const void* scale, int64_t scale_bytes,
                                             int64_t batch, int64_t rows, int64_t cols);

// The same for an input whose geometry differs from q's: `in` is [in_batch, in_rows, in_cols]
// (two halves of a row, rows picked by a map, ...).
fp8quant_status_t check_quantization_buffers(Operand& in, int64_t in_batch, int64_t in_rows, int64_t in_cols,
                                             Operand& q, const void* scale, int64_t scale_bytes, int64_t batch,
                                             int64_t rows, int64_t cols);

}  // namespace fp8quant::api
