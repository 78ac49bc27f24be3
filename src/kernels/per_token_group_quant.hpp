// Host-side description of one per-token-group quantization, validated by the C API and
// handed to the launcher of the device's architecture.
#pragma once

#include <cstdint>

#include "common/arch.hpp"
#include "common/fast_divisor.hpp"
#include "common/scale_order.hpp"
#include "fp8quant/quant.h"
#include "kernels/moe_source.hpp"

namespace fp8quant {

// The quantization's own fields. QuantProblem puts them first and the MoE sources' (MoeSource,
// zero for QuantSource::kRows) after them: the plain kernels then read their parameters at the
// offsets they had before the MoE fields were shared, and compile to the same machine code.
struct GroupQuantFields {
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
};

struct QuantProblem : GroupQuantFields, MoeSource {};

// Rows of scales one warp's teams share: column-ordered scales (mn, mn_tma) order teams in tiles
// of four rows, m fastest, so that a warp stores four consecutive scales of a column; row and
// packed go row by row.
constexpr int32_t row_tile(ScaleOrder order) { return order == ScaleOrder::kColumn ? 4 : 1; }

// Rows of the tiles teams walk: row_tile(order) for plain rows, one for the MoE sources, so that
// a warp's teams hold consecutive groups of one row (of one row when G % 4 == 0 or the scales
// are packed). The scatter source's tokens land on scattered destination rows, where no two of
// a tile share a scale column run; the SiLU-and-mul source reads an expert's rows, of which
// only the first few may hold tokens, and row by row those fill whole warps (in tiles of four,
// a masked layout's one live row would leave three teams of every warp idle).
constexpr int32_t team_row_tile(ScaleOrder order, QuantSource source) {
  return source == QuantSource::kRows ? row_tile(order) : 1;
}

// Teams a launch covers for one batch: every slot of every row, rows rounded up to whole tiles
// of `tile` rows.
constexpr int64_t team_units(int32_t tile, int64_t rows, int64_t slots) {
  return (rows + tile - 1) / tile * tile * slots;
}

FP8QUANT_DECLARE_ARCH_ENTRIES(per_token_group_quant, QuantProblem)

}  // namespace fp8quant
