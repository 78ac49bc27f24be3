// Host-side description of one per-token-group quantization, validated by the C API and
// handed to the launcher of the device's architecture.
#pragma once

#include <cstdint>

#include "common/arch.hpp"
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
  int32_t units;  // teams one batch launches: team_units(tile, rows, slots), tile = team_row_tile(order, source)
  FastDivisor tile_units;   // teams per tile of `tile` rows: tile * slots
  int32_t sm_count;         // streaming multiprocessors of the device
  int32_t prefetch_blocks;  // blocks of the first wave, which prefetch x (set by the launcher)
  float eps;
  fp8quant_dtype_t dtype;
  fp8quant_scale_layout_t layout;
  int32_t group_size;
  bool ue8m0;
  bool aligned;  // x and q pointers and strides allow 16-byte accesses
  bool pdl;      // launch with programmatic dependent launch (fp8quant_set_pdl)

  // MoE sources (docs/contract.md, "MoE"); zero for QuantSource::kRows. Rows that hold no token
  // are padding: inside a tile (the rows a grouped GEMM's tile reads) their scales are 0 and
  // their q bytes are not written; past the tiles nothing is written.
  //   kSiluMul  destination row m of batch b is live when m < row_counts[b] (masked layouts;
  //             rows below align_up(row_counts[b], pad_align) are in a tile) and row_map[m] >= 0
  //             (contiguous layout; rows below *used_rows, or every row without it, are in a tile).
  //   kScatter  teams walk x's rows (tokens); token t's quantized row is stored at the flat
  //             destination row row_map[t * slots_per_row + j] of each slot j ([dest_batch,
  //             dest_m] rows; -1 or a row past them: dropped). Then pad_chunks blocks per
  //             expert zero the scales of that expert's tile padding: rows [row_starts[e] + row_counts[e],
  //             row_starts[e + 1]) (contiguous) or [row_counts[e], align_up(row_counts[e],
  //             pad_align)) of batch e (masked, row_starts null).
  QuantSource source;
  int64_t up_offset;          // kSiluMul: elements from a row's gate half to its up half
  const int32_t* row_map;     // kSiluMul: m_indices, or null; kScatter: the slots' rows [tokens, slots_per_row]
  const int32_t* row_counts;  // live rows of each batch (kSiluMul, masked) or expert (kScatter), or null
  const int32_t* row_starts;  // kScatter, contiguous: each expert's first row [experts + 1], or null
  const int32_t* used_rows;   // kSiluMul, contiguous: rows at or past *used_rows are untouched, or null
  int32_t pad_align;          // masked layouts: rows per tile
  int32_t slots_per_row;      // kScatter: slots per token (k)
  int32_t experts;            // kScatter: experts whose tile padding the last blocks zero
  int32_t dest_batch;         // kScatter: batches of q and the scales (1, or experts when masked)
  int32_t dest_m;             // kScatter: rows per destination batch
  int32_t dest_rows;          // kScatter: scale layout rows per destination batch (dest_m, or aligned)
  int32_t token_blocks;       // kScatter: blocks of the token part (set by the launcher)
  int32_t pad_chunks;         // kScatter: padding blocks per expert (set by the launcher)
};

// Rows of scales one warp's teams share: column-ordered scales (mn, mn_tma) order teams in tiles
// of four rows, m fastest, so that a warp stores four consecutive scales of a column; row and
// packed go row by row.
constexpr int32_t row_tile(ScaleOrder order) { return order == ScaleOrder::kColumn ? 4 : 1; }
constexpr int32_t row_tile(fp8quant_scale_layout_t layout) { return row_tile(scale_order(layout)); }

// Rows of the tiles teams walk: row_tile(order), but one for the scatter source, whose tokens'
// rows land on scattered destination rows (no two of a tile share a scale column run there),
// so that a warp's teams hold consecutive groups of a token (of one token when G % 4 == 0 or
// the scales are packed).
constexpr int32_t team_row_tile(ScaleOrder order, QuantSource source) {
  return source == QuantSource::kScatter ? 1 : row_tile(order);
}

// Teams a launch covers for one batch: every slot of every row, rows rounded up to whole tiles
// of `tile` rows.
constexpr int64_t team_units(int32_t tile, int64_t rows, int64_t slots) {
  return (rows + tile - 1) / tile * tile * slots;
}
constexpr int64_t team_units(fp8quant_scale_layout_t layout, int64_t rows, int64_t slots) {
  return team_units(row_tile(layout), rows, slots);
}

FP8QUANT_DECLARE_ARCH_ENTRIES(per_token_group_quant, QuantProblem)

}  // namespace fp8quant
