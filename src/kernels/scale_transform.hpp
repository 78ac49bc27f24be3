// Host-side description of one scale transform (convert, pack, unpack; SPEC.md sections 2 and 3),
// validated by the C API and handed to the launcher of the device's architecture.
#pragma once

#include <cstdint>

#include "common/arch.hpp"
#include "common/scale_order.hpp"
#include "fp8quant/common.h"

namespace fp8quant {

// The kernel walks the destination buffer, padding included, one 4-byte element per thread, and
// reads the source through strides, so one kernel serves every pair of layouts. Destination
// element (b, r, c) with r >= rows is padding (0); otherwise it takes source row r / row_div:
// group c (convert, unpack: byte c % 4 of word c / 4) or groups 4c .. 4c + 3 (pack).
struct ScaleTransformProblem {
  const void* src;
  void* dst;
  unsigned long long* first_invalid;  // may be null
  int64_t src_batch_stride;           // 4-byte elements of src
  int64_t src_row_stride;
  int64_t src_col_stride;
  int64_t dst_batch_stride;  // 4-byte elements of dst: dst_rows * dst_cols
  int64_t dst_rows;          // rows of the destination buffer, padding included
  int64_t dst_cols;          // groups (fp32 destination) or words (packed)
  int64_t total;             // batch * dst_batch_stride
  int64_t rows;              // rows holding scales
  int64_t src_rows;          // ceil(rows / row_div): rows of the source, for first_invalid
  int64_t groups;            // scales per row
  int64_t row_div;           // 1, or block_n for the weight-scale broadcast
  ScaleTransform op;
  bool dst_row_major;  // dst is the row layout (element (r, c) at r * dst_cols + c); else MN-major
  bool pdl;            // launch with programmatic dependent launch (fp8quant_set_pdl)
};

FP8QUANT_DECLARE_ARCH_ENTRIES(scale_transform, ScaleTransformProblem)

}  // namespace fp8quant
