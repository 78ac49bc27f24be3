// The group quantizer's C API body, shared by the ops built on its kernel: validation, geometry
// and launch of a quantization into q [batch, m, k] and a scale layout, reading x's own rows
// (per_token_group_quant) or an MoE source (silu_mul_quant, moe_dispatch_quant).
#pragma once

#include <cstdint>
#include <string>

#include "common/error.hpp"
#include "fp8quant/quant.h"
#include "kernels/per_token_group_quant.hpp"

namespace fp8quant::api {

// An index array the kernel reads (a row map, per-batch counts): the outputs must not overlap it.
struct IndexInput {
  const char* name = nullptr;
  const void* ptr = nullptr;
  int64_t bytes = 0;
};

// Where the rows come from; the default is x's own rows. `in_*` is x's geometry for the buffer
// checks (two halves per row for kSiluMul, the tokens for kScatter); the other fields are
// QuantProblem's (their values validated by the caller). For kScatter, batch and m given to
// group_quant are the destination's (1 x rows, or experts x max_m) and the kernel's teams walk
// the in_rows tokens.
struct GroupSource {
  QuantSource kind = QuantSource::kRows;
  int64_t in_batch = 0;
  int64_t in_rows = 0;
  int64_t in_cols = 0;
  int64_t up_offset = 0;
  const int32_t* row_map = nullptr;
  const int32_t* row_counts = nullptr;
  const int32_t* row_starts = nullptr;
  const int32_t* used_rows = nullptr;
  int64_t pad_align = 1;
  int64_t slots_per_row = 0;
  int64_t experts = 0;
  IndexInput indices[3];  // the arrays above, for the overlap checks (unused entries empty)
};

// Copy the source's fields into `problem` (QuantProblem or BlockScaledProblem).
template <class Problem>
void copy_source(Problem& problem, const GroupSource& source) {
  problem.source = source.kind;
  problem.up_offset = source.up_offset;
  problem.row_map = source.row_map;
  problem.row_counts = source.row_counts;
  problem.row_starts = source.row_starts;
  problem.used_rows = source.used_rows;
  problem.pad_align = static_cast<int32_t>(source.pad_align);
}

// Turn `problem` (QuantProblem or BlockScaledProblem), filled for the destination's geometry
// (batch x m rows, `rows` scale rows per batch), into the dispatch's: teams walk the source's
// tokens (`token_units` of them, at most `max_units`) and store into that geometry.
template <class Problem>
fp8quant_status_t walk_tokens(Problem& problem, const GroupSource& source, int64_t batch, int64_t m, int64_t rows,
                              int64_t token_units, int64_t max_units) {
  FP8QUANT_CHECK_ARG(token_units <= max_units, "tokens",
                     "the tokens need " + std::to_string(token_units) + " group slots, more than the limit of " +
                         std::to_string(max_units));
  problem.slots_per_row = static_cast<int32_t>(source.slots_per_row);
  problem.experts = static_cast<int32_t>(source.experts);
  problem.dest_batch = static_cast<int32_t>(batch);
  problem.dest_m = static_cast<int32_t>(m);
  problem.dest_rows = static_cast<int32_t>(rows);
  problem.batch = 1;
  problem.m = static_cast<int32_t>(source.in_rows);
  problem.rows = static_cast<int32_t>(source.in_rows);
  problem.units = static_cast<int32_t>(token_units);
  return FP8QUANT_SUCCESS;
}

fp8quant_status_t group_quant(const void* x, fp8quant_dtype_t x_dtype, int64_t batch, int64_t m, int64_t k,
                              int64_t x_batch_stride, int64_t x_row_stride, void* q, int64_t q_batch_stride,
                              int64_t q_row_stride, void* scale, fp8quant_scale_layout_t scale_layout, int ue8m0,
                              int64_t group_size, float eps, const GroupSource& source, cudaStream_t stream);

}  // namespace fp8quant::api
