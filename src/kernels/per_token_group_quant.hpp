// Host-side description of one per-token-group quantization, validated by the C API and
// handed to the launcher of the device's architecture.
#pragma once

#include <cstdint>

#include "common/fast_divisor.hpp"
#include "common/scale_order.hpp"
#include "fp8quant/quant.h"

namespace fp8quant {

struct QuantProblem {
  const void* x;
  void* q;
  void* scale;
  int64_t x_batch_stride;      // elements
  int64_t x_row_stride;        // elements
  int64_t q_batch_stride;      // bytes
  int64_t q_row_stride;        // bytes
  int64_t scale_batch_stride;  // scale elements
  int32_t batch;
  int32_t m;
  int32_t num_groups;
  int32_t rows;   // rows of the scale layout: m, or align(m, 4) for the TMA-aligned layouts
  int32_t slots;  // group slots per row: num_groups, or 4 * ceil(num_groups / 4) when packed
  int32_t units;  // teams one batch launches: team_units(layout, rows, slots)
  FastDivisor tile_units;   // teams per tile of row_tile(layout) rows: row_tile(layout) * slots
  int32_t sm_count;         // streaming multiprocessors of the device
  int32_t prefetch_blocks;  // blocks of the first wave, which prefetch x (set by the launcher)
  float eps;
  fp8quant_dtype_t dtype;
  fp8quant_scale_layout_t layout;
  int32_t group_size;
  bool ue8m0;
  bool aligned;  // x and q pointers and strides allow 16-byte accesses
  bool pdl;      // launch with programmatic dependent launch (fp8quant_set_pdl)

  // MoE sources (docs/contract.md, "MoE"); zero for QuantSource::kRows. A destination row m of
  // batch b is live when m < row_counts[b] (if given) and row_map[row_starts[b] + m] >= 0 (if
  // given; row_starts 0 when absent); other rows are padding: q and scales 0.
  QuantSource source;
  int64_t up_offset;          // kSiluMul: elements from a row's gate half to its up half
  const int32_t* row_map;     // kGather: source row of x (row_token); kSiluMul: m_indices, or null
  int64_t map_entries;        // entries of row_map: an entry past them makes its row padding
  const int32_t* row_starts;  // masked layouts: first row_map entry of each batch, or null
  const int32_t* row_counts;  // masked layouts: live rows of each batch, or null
  int64_t gather_rows;        // kGather: rows of x; a row_map value past them makes its row padding
};

// Rows of scales one warp's teams share: column-ordered scales (mn, mn_tma) order teams in tiles
// of four rows, m fastest, so that a warp stores four consecutive scales of a column; row and
// packed go row by row.
constexpr int32_t row_tile(ScaleOrder order) { return order == ScaleOrder::kColumn ? 4 : 1; }
constexpr int32_t row_tile(fp8quant_scale_layout_t layout) { return row_tile(scale_order(layout)); }

// Teams a launch covers for one batch: every slot of every row, rows rounded up to whole tiles.
constexpr int64_t team_units(fp8quant_scale_layout_t layout, int64_t rows, int64_t slots) {
  return (rows + row_tile(layout) - 1) / row_tile(layout) * row_tile(layout) * slots;
}

namespace sm90 {
fp8quant_status_t per_token_group_quant(const QuantProblem& problem, cudaStream_t stream);
}  // namespace sm90

namespace sm100 {
fp8quant_status_t per_token_group_quant(const QuantProblem& problem, cudaStream_t stream);
}  // namespace sm100

}  // namespace fp8quant
