// The group quantizer's C API body, shared by the ops built on its kernel: validation, geometry
// and launch of a quantization into q [batch, m, k] and a scale layout, reading x's own rows
// (per_token_group_quant) or an MoE source (silu_mul_quant, moe_dispatch_quant).
#pragma once

#include <cstdint>
#include <string>

#include "api/checks.hpp"
#include "common/error.hpp"
#include "fp8quant/quant.h"
#include "kernels/per_token_group_quant.hpp"

namespace fp8quant::api {

// An array of 4-byte elements (int32 row maps and counts, float32 encode scales) the kernel
// reads, `count` of them (0: not read; a size the body has validated): non-null and 4-byte
// aligned when read, and the outputs must not overlap it.
struct IndexInput {
  const char* name = nullptr;
  const void* ptr = nullptr;
  int64_t count = 0;
};

// Where the rows come from; the default is x's own rows. `in_*` is x's geometry for the buffer
// checks (two halves per row for kSiluMul, the tokens for kScatter; ignored for kRows); the other
// fields are QuantProblem's (their values validated by the caller). For kScatter, batch and m
// given to group_quant are the destination's (1 x rows, or experts x max_m) and the kernel's
// teams walk the in_rows tokens. The bodies name batch, m and k as the caller's op names them.
struct GroupSource {
  QuantSource kind = QuantSource::kRows;
  const char* batch_name = "batch";
  const char* m_name = "m";
  const char* k_name = "k";
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
  problem.pad_align = FastDivisor(static_cast<uint32_t>(source.pad_align));
}

// The strides and spans of x (`in`: x's own rows [batch, m, k_cols], or the source's geometry)
// and q ([batch, m, q_cols]), checked on every call (check_quantization_strides); *empty: the
// call reads, writes and launches nothing.
inline fp8quant_status_t check_source_strides(const GroupSource& source, Operand& in, Operand& q, int64_t batch,
                                              int64_t m, int64_t k_cols, int64_t q_cols, bool* empty) {
  const bool own = source.kind == QuantSource::kRows;
  const int64_t in_batch = own ? batch : source.in_batch, in_rows = own ? m : source.in_rows;
  const int64_t in_cols = own ? k_cols : source.in_cols;
  FP8QUANT_RETURN_IF_ERROR(check_quantization_strides(in, in_batch, in_rows, in_cols, q, batch, m, q_cols));
  *empty = batch == 0 || m == 0 || in_batch == 0 || in_rows == 0;
  return FP8QUANT_SUCCESS;
}

// The fields every group quantization's problem (QuantProblem, BlockScaledProblem) takes from its
// checked operands (x: `in`, q at `q` with the strides of `qs`) and geometry.
template <class Problem>
void set_group_operands(Problem& problem, const Operand& in, void* q, const Operand& qs, int64_t batch, int64_t m,
                        int64_t num_groups, int64_t rows, int64_t slots) {
  problem.x = in.ptr;
  problem.q = q;
  problem.x_batch_stride = in.batch_stride;
  problem.x_row_stride = in.row_stride;
  problem.q_batch_stride = qs.batch_stride;
  problem.q_row_stride = qs.row_stride;
  problem.batch = static_cast<int32_t>(batch);
  problem.m = static_cast<int32_t>(m);
  problem.num_groups = static_cast<int32_t>(num_groups);
  problem.rows = static_cast<int32_t>(rows);
  problem.slots = static_cast<int32_t>(slots);
}

// kScatter's padding part on grid.x: per expert, one block for every 8 of its `pad_columns`
// (validated) scale columns.
inline fp8quant_status_t check_scatter_padding(const GroupSource& source, int64_t pad_columns) {
  if (source.kind != QuantSource::kScatter) return FP8QUANT_SUCCESS;
  const int64_t chunks = (pad_columns + 7) / 8;
  FP8QUANT_CHECK_ARG(source.experts * chunks <= (int64_t{1} << 30), "experts",
                     "experts * " + std::to_string(chunks) +
                         " (padding blocks per expert for this h) must be at most 2^30 (they go on grid.x)");
  return FP8QUANT_SUCCESS;
}

// The index arrays of an op that has work: non-null and 4-byte aligned where read, and apart
// from q (`q_bytes`) and the scales (`scale_bytes`).
inline fp8quant_status_t check_index_inputs(const IndexInput* inputs, int n, const void* q, int64_t q_bytes,
                                            const void* scale, int64_t scale_bytes) {
  for (int i = 0; i < n; ++i) {
    const IndexInput& index = inputs[i];
    if (index.count == 0) continue;
    FP8QUANT_CHECK_ARG(index.ptr != nullptr, index.name, "must not be null");
    FP8QUANT_CHECK_ARG(reinterpret_cast<uintptr_t>(index.ptr) % 4 == 0, index.name, "must be 4-byte aligned");
  }
  for (int i = 0; i < n; ++i) {
    const IndexInput& index = inputs[i];
    if (index.count == 0) continue;
    FP8QUANT_RETURN_IF_ERROR(check_apart("q", q, q_bytes, index.name, index.ptr, index.count * 4));
    FP8QUANT_RETURN_IF_ERROR(check_apart("scale", scale, scale_bytes, index.name, index.ptr, index.count * 4));
  }
  return FP8QUANT_SUCCESS;
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
