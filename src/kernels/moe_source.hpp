// The MoE sources of the quantizer kernels (docs/contract.md, "MoE"), the fields their problems
// (QuantProblem, BlockScaledProblem) share: where a kernel's rows come from, and which of them
// hold tokens.
#pragma once

#include <cstdint>

#include "common/fast_divisor.hpp"
#include "common/scale_order.hpp"

namespace fp8quant {

// Zero for QuantSource::kRows (x's own rows). Rows that hold no token are padding: inside a tile
// (the rows a grouped GEMM's tile reads) their scales are 0 and their q bytes are not written;
// past the tiles nothing is written.
struct MoeSource {
  //   kSiluMul  destination row m of batch b is live when m < row_counts[b] (masked layouts;
  //             rows below align_up(row_counts[b], pad_align) are in a tile) and row_map[m] >= 0
  //             (contiguous layout; rows below *used_rows, or every row without it, are in a tile).
  //   kScatter  teams walk x's rows (tokens); token t's quantized row is stored at the flat
  //             destination row row_map[t * slots_per_row + j] of each slot j ([dest_batch,
  //             dest_m] rows; -1 or a row past them: dropped). Then pad_chunks blocks per
  //             expert zero the scales of that expert's tile padding: rows [row_starts[e] +
  //             row_counts[e], row_starts[e + 1]) (contiguous) or [row_counts[e],
  //             align_up(row_counts[e], pad_align)) of batch e (masked, row_starts null).
  QuantSource source;
  int64_t up_offset;          // kSiluMul: elements from a row's gate half to its up half
  const int32_t* row_map;     // kSiluMul: m_indices, or null; kScatter: the slots' rows [tokens, slots_per_row]
  const int32_t* row_counts;  // live rows of each batch (kSiluMul, masked) or expert (kScatter), or null
  const int32_t* row_starts;  // kScatter, contiguous: each expert's first row [experts + 1], or null
  const int32_t* used_rows;   // kSiluMul, contiguous: rows at or past *used_rows are untouched, or null
  FastDivisor pad_align;      // masked layouts: rows per tile
  int32_t slots_per_row;      // kScatter: slots per token (k)
  int32_t experts;            // kScatter: experts whose tile padding the last blocks zero
  int32_t dest_batch;         // kScatter: batches of q and the scales (1, or experts when masked)
  int32_t dest_m;             // kScatter: rows per destination batch
  int32_t dest_rows;          // kScatter: scale layout rows per destination batch (dest_m, or aligned)
  int32_t token_blocks;       // blocks of the token part, a batch (set by the launcher; walk_tiles)
  int32_t pad_chunks;         // kScatter: padding blocks per expert (set by the launcher)
};

}  // namespace fp8quant
