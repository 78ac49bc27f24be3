// Which rows of an MoE layout hold tokens (docs/contract.md, "MoE"), for the kernels that read or
// write expert rows (the SiLU-and-mul and dispatch sources of per_token_group_quant.cuh and
// block_scaled_quant.cuh): a row without a token is padding; inside a grouped GEMM's tile its
// scales are written as 0, past the tiles nothing is touched.
#pragma once

#include <cuda_runtime.h>

#include <algorithm>
#include <cstdint>

#include "common/fast_divisor.hpp"
#include "common/reduce.cuh"

namespace fp8quant::kernels {

// The end of the tile of `count` rows (an int32; none when negative) in a layout of `align`-row
// tiles (masked MoE layouts). It follows the load of a row count in every masked launch: a
// multiply-high, not a 64-bit division.
__device__ __forceinline__ int64_t tile_end(int64_t count, const FastDivisor& align) {
  const uint32_t rows = static_cast<uint32_t>(max(count, int64_t{0})), tiles = align.divide(rows);
  return (int64_t{tiles} + (rows != tiles * align.divisor())) * align.divisor();
}

// Narrow `live` (row m of batch b holds a token) and `in_tile` (a GEMM tile reads it), which
// start as "a real row" and "a slot of the scale layout", to the rows of an MoE layout, as the
// problem p (QuantProblem, BlockScaledProblem) describes them:
//   row_counts  masked layouts: the live rows of each batch; tiles of pad_align rows end at
//               align_up(row_counts[b], pad_align);
//   row_map     contiguous layout (row_counts null): m_indices, -1 on padding; rows at or past
//               *used_rows (M_sum), when given, are in no tile.
// With neither, nothing changes. Returns true when the block's first row (its lowest),
// `block_first`, is past every tile: the block has nothing to do.
template <class Problem>
__device__ __forceinline__ bool narrow_to_moe_rows(const Problem& p, int64_t b, int32_t block_first, int32_t m,
                                                   bool& live, bool& in_tile) {
  if (p.row_counts != nullptr) {
    const int64_t count = __ldg(p.row_counts + b), end = tile_end(count, p.pad_align);
    if (block_first >= end) return true;
    live = live && m < count;
    in_tile = in_tile && m < end;
  } else if (p.row_map != nullptr) {
    if (p.used_rows != nullptr) {  // rows past M_sum are not touched, whatever m_indices holds there
      const int32_t used = __ldg(p.used_rows);
      if (block_first >= used) return true;
      live = live && m < used;
      in_tile = in_tile && m < used;
    }
    live = live && __ldg(p.row_map + m) >= 0;
  }
  return false;
}

// Expert e's tile padding in the dispatch's destination, as the problem p describes it: rows
// [first, last) of batch b, clamped to the layout's `rows` (contiguous: [row_starts[e] +
// row_counts[e], row_starts[e + 1]) of batch 0; masked, row_starts null: [row_counts[e],
// align_up(row_counts[e], pad_align)) of batch e).
struct TilePadding {
  int64_t b;
  int32_t first;
  int32_t last;
};

template <class Problem>
__device__ __forceinline__ TilePadding tile_padding(const Problem& p, int32_t e, int32_t rows) {
  const int64_t count = max(__ldg(p.row_counts + e), 0);
  int64_t b = 0, lo = count, hi = tile_end(count, p.pad_align);
  if (p.row_starts != nullptr) {
    lo += __ldg(p.row_starts + e);
    hi = __ldg(p.row_starts + e + 1);
  } else {
    b = e;
  }
  const int32_t last = static_cast<int32_t>(min(hi, int64_t{rows}));
  const int32_t first = static_cast<int32_t>(min(max(lo, int64_t{0}), int64_t{last}));  // clamped in 64 bits
  return {b, first, last};
}

// Slots a dispatch kernel (kScatter) handles at a time: their destination rows are loaded
// together, before any of their stores.
constexpr int kSlotBatch = 8;

// Destination rows of token `token`'s slots j0 .. j0 + kBatch - 1 (kScatter), -1 past its slots
// or when not `live`.
template <int kBatch, class Problem>
__device__ __forceinline__ void load_slot_rows(const Problem& p, int32_t token, int32_t j0, bool live,
                                               int32_t (&rows)[kBatch]) {
  const int32_t* slot_rows = p.row_map + int64_t{token} * p.slots_per_row;
#pragma unroll
  for (int i = 0; i < kBatch; ++i) rows[i] = live && j0 + i < p.slots_per_row ? __ldg(slot_rows + j0 + i) : -1;
}

// The padding part of a dispatch launch (kScatter): the blocks past its token part (blockIdx.x >=
// p.token_blocks), pad_chunks of them per expert, each zeroing one chunk of kChunk scale columns
// of its expert's tile padding: zero(e, c0) for columns [c0, c0 + kChunk). Returns whether this
// block is one (it has then done its work); it waits for the previous kernel first.
template <int32_t kChunk, class Problem, class Zero>
__device__ __forceinline__ bool padding_block(const Problem& p, Zero&& zero) {
  if (static_cast<int32_t>(blockIdx.x) < p.token_blocks) return false;
  asm volatile("griddepcontrol.wait;" ::: "memory");
  asm volatile("griddepcontrol.launch_dependents;");
  const int32_t pad_block = static_cast<int32_t>(blockIdx.x) - p.token_blocks;
  zero(pad_block / p.pad_chunks, pad_block % p.pad_chunks * kChunk);
  return true;
}

// The grid of such a launch (host side): the token part's blocks (problem.units teams,
// teams_per_block a block) and, with `scatter`, the padding part's pad_chunks blocks per expert
// (chunks of kChunk of the `columns` scale columns); sets problem.token_blocks and pad_chunks.
template <int32_t kChunk, class Problem>
dim3 token_and_padding_grid(Problem& problem, int teams_per_block, int32_t columns, bool scatter) {
  problem.token_blocks = (problem.units + teams_per_block - 1) / teams_per_block;
  problem.pad_chunks = (columns + kChunk - 1) / kChunk;
  const int pad_blocks = scatter ? problem.experts * problem.pad_chunks : 0;
  return dim3(problem.token_blocks + pad_blocks, problem.batch);
}

// The walk of a masked SiLU-and-mul launch (kWalk): a grid of walk_blocks blocks shares the
// block tiles of every batch, p.token_blocks a batch, numbered tile-major (f = tile * batch + b:
// the first tiles of every batch, which its rows fill first, come first); block i takes tiles
// f = i, i + gridDim.x, i + 2 gridDim.x, ... Its warps judge 32 of them at a time, one a lane: a
// tile is needed when its first row, first_row(tile), lies inside its batch's tiles
// (narrow_to_moe_rows). visit(tile, b) runs for each needed tile in turn; every warp of the
// block judges the same tiles alike, so the visits are block-uniform. Busy and idle batches
// share the blocks whatever the routing, and a tile without rows costs a lane's test.
// Host-guaranteed (walk_blocks): token_blocks * batch < 2^31.
template <class Problem, class FirstRow, class Visit>
__device__ __forceinline__ void walk_tiles(const Problem& p, FirstRow first_row, Visit visit) {
  const uint32_t batch = static_cast<uint32_t>(p.batch), tiles = static_cast<uint32_t>(p.token_blocks);
  const uint32_t step = 32 * gridDim.x;  // a lane's next tile: its tile and batch advance by these
  const uint32_t step_tile = step / batch, step_b = step - step_tile * batch;
  const uint32_t f = blockIdx.x + threadIdx.x % 32 * gridDim.x;
  uint32_t tile = f / batch, b = f - tile * batch;
  for (uint32_t round = (tiles * batch - blockIdx.x + step - 1) / step; round > 0; --round) {
    const bool needed =
        tile < tiles && first_row(static_cast<int32_t>(tile)) < tile_end(__ldg(p.row_counts + b), p.pad_align);
    for (uint32_t lanes = __ballot_sync(kFullMask, needed); lanes != 0; lanes &= lanes - 1) {
      const int lane = __ffs(lanes) - 1;
      visit(static_cast<int32_t>(__shfl_sync(kFullMask, tile, lane)),
            static_cast<int32_t>(__shfl_sync(kFullMask, b, lane)));
    }
    tile += step_tile;
    b += step_b;
    if (b >= batch) {
      b -= batch;
      ++tile;
    }
  }
}

// The grid of a masked SiLU-and-mul launch (p.row_counts set) whose p.token_blocks blocks a batch
// give each team a unit of its own, `wave` of which the device holds at once: kWalkWaves waves
// of walking blocks (walk_tiles) when that leaves each block two tiles or more; else 0, the
// launch one block a tile. Engines size the masked layout by a static bound (max_m = T, or T
// rounded up to 128) where an expert holds about T * k / E rows: a block per tile of the bound's
// rows would launch blocks by the hundred thousand at prefill, nearly all of them only to find
// their rows empty. Below two tiles a block, the walk's prologue costs more than the blocks it
// saves (walking from one wave of two tiles a block made a skewed T = 16 launch 1.6x slower).
// The choice is measured: docs/benchmarks-history.md, twentieth to twenty-second runs.
constexpr int64_t kWalkWaves = 2;

template <class Problem>
uint32_t walk_blocks(const Problem& p, int64_t wave) {
  const int64_t tiles = int64_t{p.token_blocks} * p.batch, blocks = kWalkWaves * wave;
  if (p.row_counts == nullptr || tiles >= (int64_t{1} << 31) || blocks < 1) return 0;
  return tiles >= 2 * blocks ? static_cast<uint32_t>(blocks) : 0;
}

}  // namespace fp8quant::kernels
