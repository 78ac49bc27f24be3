// Block-scaled quantization for Blackwell's tensor cores (docs/contract.md, "MXFP8" and "NVFP4"):
// one pass reads x once, writes q once and writes each group's scale byte straight into the
// scale layout (row-major, or swizzled, padding included), from the block-scaled group pieces
// (block_scaled_group.cuh).
//
// Work split: a team of kGroup / 16 consecutive threads owns one group (16 elements per thread:
// one or two 16-byte loads; MXFP8 stores 16 bytes a thread, NVFP4 8); teams walk the (row r, group
// slot c) grid slot by slot, so consecutive teams read consecutive groups of a row. Slots past
// the row's groups and rows past m (the swizzled layout's padding) load nothing and store a zero
// byte. NVFP4's plain rows of at least kChunkSlots slots go in chunks instead, in launches past
// one wave of the device's threads (nvfp4_chunks): a warp takes kChunkSlots slots of one row, a
// lane kChunkGroups groups 32 slots apart, so that a thread's address, row and scale-offset work
// is paid once for several groups (NVFP4 converts 16 elements a thread, where that work weighs
// most) and every load and store of the warp stays contiguous.
//
// The MoE sources follow the MoE layouts' rows as the FP8 kernel does (moe_rows.cuh): rows
// without a token get zero scale bytes inside a GEMM tile and nothing else. The SiLU-and-mul
// source (kSiluMul) reads silu(gate) * up of x's rows [gate | up]; the dispatch source
// (kScatter, NVFP4) walks the tokens and stores each at its slots' rows, encoded with each
// slot's expert's encode scale (the group's amax reduced once).
//
// Programmatic dependent launch: nothing touches global memory before griddepcontrol.wait
// (docs/kernels.md).
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

#include "common/dispatch.hpp"
#include "common/error.hpp"
#include "common/launch.cuh"
#include "kernels/block_scaled_group.cuh"
#include "kernels/block_scaled_quant.hpp"
#include "kernels/group_slice.cuh"
#include "kernels/moe_rows.cuh"

namespace fp8quant::kernels {

constexpr int kMxThreads = 256;

constexpr int kMxWarps = kMxThreads / 32;

// NVFP4's chunks: groups a lane takes, 32 slots apart, and the slots of a warp's chunk.
constexpr int kChunkGroups = 2;
constexpr int32_t kChunkSlots = 32 * kChunkGroups;

// Scale columns one block of kScatter's padding part zeroes (the part has kPadSlots-wide chunks
// of every expert's slots, one block each).
constexpr int32_t kPadSlots = 8;

// NVFP4's encode scale of batch or expert e: global_scale[e], e clamped into the scales given
// (with one for all, e plays no part), so that an index the routing does not vouch for (an
// m_indices entry that disagrees with it) reads a scale, never memory past the buffer.
__device__ __forceinline__ float encode_scale(const BlockScaledProblem& p, int64_t e) {
  return __ldg(p.global_scale + min(max(e, int64_t{0}), int64_t{p.global_scales - 1}));
}

// One block of kScatter's padding part: the scale bytes of expert e's tile padding rows set to 0
// in slots [c0, c0 + kPadSlots). Threads walk the rows of one slot at a time.
template <bool kSwizzled>
__device__ __forceinline__ void zero_block_tile_padding(const BlockScaledProblem& p, int32_t e, int32_t c0) {
  const TilePadding pad = tile_padding(p, e, p.dest_rows);
  uint8_t* scale = p.scale + pad.b * p.scale_batch_stride;
  for (int32_t c = c0; c < min(c0 + kPadSlots, p.slots); ++c) {
    for (int32_t r = pad.first + static_cast<int32_t>(threadIdx.x); r < pad.last;
         r += static_cast<int32_t>(blockDim.x)) {
      scale[mx_scale_offset<kSwizzled>(p.slots, r, c)] = 0;
    }
  }
}

// kScatter's token part (NVFP4): the team's group of token r, reduced once, then encoded with
// the encode scale of each slot's expert and stored at the slot's row (q where the group is
// real, the scale byte, 0 in the padding slots, wherever the slot is kept). The slots go
// kSlotBatch at a time, their rows (the first batch's: `rows`, loaded with x), experts and
// encode scales all loaded before their stores.
template <typename T, bool kSwizzled, bool kAligned>
__device__ __forceinline__ void scatter_nvfp4(const BlockScaledProblem& p, const Slice<T>& slice, int32_t r, int32_t c,
                                              bool live, bool in_range, int64_t q_col, int32_t (&rows)[kSlotBatch]) {
  float v[kElemsPerThread];
  bool finite;
  const float amax = lane_finite_amax<T>(slice, v, &finite);
  const int64_t dest_total = int64_t{p.dest_batch} * p.dest_m;
  for (int32_t j0 = 0; j0 < p.slots_per_row; j0 += kSlotBatch) {  // the same count on every lane
    if (j0 > 0) load_slot_rows<kSlotBatch>(p, r, j0, in_range, rows);

    // The slots' experts and encode scales (a masked row's expert is its batch)
    float scales[kSlotBatch];
#pragma unroll
    for (int i = 0; i < kSlotBatch; ++i) {
      if (rows[i] >= dest_total) rows[i] = -1;  // past the layout: dropped
      int32_t expert = 0;
      if (p.global_scales > 1 && rows[i] >= 0) {
        expert = p.row_starts != nullptr ? __ldg(p.row_experts + rows[i]) : rows[i] / p.dest_m;
      }
      scales[i] = encode_scale(p, expert);
    }

    // Encode and store
#pragma unroll
    for (int i = 0; i < kSlotBatch; ++i) {
      const int32_t row = rows[i];
      if (row < 0) continue;
      const int32_t db = p.dest_batch > 1 ? row / p.dest_m : 0, dm = row - db * p.dest_m;
      const Fp4Slice out = encode_nvfp4<T>(slice, v, amax, finite, scales[i]);
      if (live) {
        BlockGroup<BlockFormat::kNvfp4> group;
#pragma unroll
        for (int w = 0; w < FormatOf<BlockFormat::kNvfp4>::kQBytes / 4; ++w) group.q[w] = out.q[w];
        uint8_t* q = static_cast<uint8_t*>(p.q) + int64_t{db} * p.q_batch_stride + int64_t{dm} * p.q_row_stride + q_col;
        store_block_q<BlockFormat::kNvfp4, kAligned>(q, group);
      }
      p.scale[int64_t{db} * p.scale_batch_stride + mx_scale_offset<kSwizzled>(p.slots, dm, c)] =
          live ? static_cast<uint8_t>(out.s) : 0;
    }
  }
}

// NVFP4's plain rows in chunks: this warp's chunk of kChunkSlots slots of row r, lane l taking
// slots c + 32 j (c = the chunk's first slot + l, j < kChunkGroups). Every group is loaded before
// the first is converted.
template <typename T, bool kSwizzled, bool kAligned>
__device__ __forceinline__ void quantize_nvfp4_chunk(const BlockScaledProblem& p) {
  using Format = FormatOf<BlockFormat::kNvfp4>;
  constexpr int64_t kScaleStep = kSwizzled ? 32 / 4 * 512 : 32;  // scale bytes 32 slots apart

  // Locate this warp's chunk and this lane's first slot
  // (unsigned: the indices are never negative, so that their divisions and widenings take no
  // sign work)
  const uint32_t unit = blockIdx.x * kMxWarps + threadIdx.x / 32;
  const uint32_t row = p.row_chunks.divide(unit);
  const uint32_t slot = (unit - row * static_cast<uint32_t>(p.chunks)) * kChunkSlots + threadIdx.x % 32;
  const int32_t r = static_cast<int32_t>(row), c = static_cast<int32_t>(slot);
  const int64_t b = blockIdx.y;
  const int64_t col = int64_t{slot} * Format::kGroup;
  const T* src = static_cast<const T*>(p.x) + b * p.x_batch_stride + int64_t{row} * p.x_row_stride + col;
  uint8_t* dst = static_cast<uint8_t*>(p.q) + b * p.q_batch_stride + int64_t{row} * p.q_row_stride + col / 2;
  // (a lane past the row's slots stores nothing: its offset is its last slot's, clear of overflow)
  uint8_t* scale = p.scale + b * p.scale_batch_stride + mx_scale_offset<kSwizzled>(p.slots, r, min(c, p.slots - 1));

  // Wait for the previous kernel's writes; let the next kernel launch
  asm volatile("griddepcontrol.wait;" ::: "memory");
  asm volatile("griddepcontrol.launch_dependents;");
  if (static_cast<int32_t>(unit) >= p.chunk_units) return;  // past the last chunk: the whole warp

  // Load (a group that is not live is never read)
  Slice<T> slice[kChunkGroups];
#pragma unroll
  for (int j = 0; j < kChunkGroups; ++j) {
    if (r < p.m && c + 32 * j < p.num_groups) load_slice<T, kAligned>(src + 32 * j * Format::kGroup, slice[j]);
  }

  // Quantize each group with the batch's encode scale; store q, and the scale byte (0 in the
  // padding slots and rows)
  const float global_scale = encode_scale(p, b);
#pragma unroll
  for (int j = 0; j < kChunkGroups; ++j) {
    if (c + 32 * j >= p.slots) break;
    const bool live = r < p.m && c + 32 * j < p.num_groups;
    if (!live) {
      scale[j * kScaleStep] = 0;
      continue;
    }
    const BlockGroup<BlockFormat::kNvfp4> out = quantize_block_group<T, BlockFormat::kNvfp4>(slice[j], global_scale);
    store_block_q<BlockFormat::kNvfp4, kAligned>(dst + 32 * j * Format::kQBytes, out);
    scale[j * kScaleStep] = static_cast<uint8_t>(out.scale);
  }
}

// A team's scale slot in batch b, for the block tile that starts at unit block_unit (lane `sub` of
// the team): its unit, row r, group slot c, element column, and its addresses in x, q and the
// scales.
template <typename T>
struct MxTeamSlot {
  int32_t unit;
  int32_t r;
  int32_t c;
  int64_t col;
  const T* src;
  uint8_t* dst;
  uint8_t* scale;
};

template <typename T, BlockFormat kFormat, bool kSwizzled>
__device__ __forceinline__ MxTeamSlot<T> mx_team_slot(const BlockScaledProblem& p, int32_t block_unit, int64_t b,
                                                      int sub) {
  using Format = FormatOf<kFormat>;
  MxTeamSlot<T> t;
  t.unit = block_unit + static_cast<int32_t>(threadIdx.x) / Format::kTeam;
  t.r = static_cast<int32_t>(p.row_slots.divide(static_cast<uint32_t>(t.unit)));
  t.c = t.unit - t.r * p.slots;
  t.col = int64_t{t.c} * Format::kGroup + sub * kElemsPerThread;
  t.src = static_cast<const T*>(p.x) + b * p.x_batch_stride + t.r * p.x_row_stride + t.col;
  t.dst = static_cast<uint8_t*>(p.q) + b * p.q_batch_stride + t.r * p.q_row_stride +
          t.col * Format::kQBytes / kElemsPerThread;
  t.scale = p.scale + b * p.scale_batch_stride + mx_scale_offset<kSwizzled>(p.slots, t.r, t.c);
  return t;
}

// The kernel: a team's scale slot (row r, group slot c), its group quantized (with the MoE
// sources, the row's or the token's), q and the scale byte stored; or with kChunked a warp's chunk.
template <class Arch, typename T, BlockFormat kFormat, bool kSwizzled, bool kAligned, QuantSource kSource,
          bool kChunked = false, bool kWalk = false>
__global__ void __launch_bounds__(kMxThreads) block_scaled_quant_kernel(const __grid_constant__ BlockScaledProblem p) {
  using Format = FormatOf<kFormat>;
  constexpr int kTeams = kMxThreads / Format::kTeam;
  static_assert(kSource != QuantSource::kScatter || Format::kFp4, "the block-scaled dispatch is NVFP4's");
  static_assert(!kChunked || (Format::kFp4 && kSource == QuantSource::kRows), "chunks are NVFP4's plain rows'");
  static_assert(!kWalk || kSource == QuantSource::kSiluMul, "only the SiLU-and-mul source walks block tiles");
  if constexpr (kChunked) {
    quantize_nvfp4_chunk<T, kSwizzled, kAligned>(p);
    return;
  }

  if constexpr (kSource == QuantSource::kScatter) {
    const auto zero = [&](int32_t e, int32_t c0) { zero_block_tile_padding<kSwizzled>(p, e, c0); };
    if (padding_block<kPadSlots>(p, zero)) return;
  }

  // Locate this team's slot (kWalk: each visited tile's, below)
  const int sub = threadIdx.x % Format::kTeam;
  const int32_t block_unit = static_cast<int32_t>(blockIdx.x) * kTeams;
  const int64_t b = blockIdx.y;
  const MxTeamSlot<T> t = mx_team_slot<T, kFormat, kSwizzled>(p, block_unit, b, sub);

  // Wait for the previous kernel's writes; let the next kernel launch
  asm volatile("griddepcontrol.wait;" ::: "memory");
  asm volatile("griddepcontrol.launch_dependents;");

  // Quantize the team's group of the block tile that starts at unit block_unit of batch b
  const auto quantize_tile = [&](const MxTeamSlot<T>& t, int32_t block_unit, int64_t b) {
    // Map the row: a real group is live; the MoE layouts' rows without a token are not, and
    // store their (zero) scale bytes only inside a tile. A block past every tile is done, and a
    // warp of rows without tokens, after storing those bytes, has nothing more to do
    bool in_tile = t.unit < p.units;
    bool live = in_tile && t.r < p.m && t.c < p.num_groups;
    if constexpr (kSource == QuantSource::kSiluMul) {
      const int32_t block_first_row = static_cast<int32_t>(p.row_slots.divide(static_cast<uint32_t>(block_unit)));
      if (narrow_to_moe_rows(p, b, block_first_row, t.r, live, in_tile)) return;
      if (__all_sync(kFullMask, !live)) {
        if (in_tile && sub == 0) *t.scale = 0;
        return;
      }
    }

    // Load (SiLU-and-mul: gate and up, combined in x's dtype), and with the dispatch source the
    // first of the token's slot rows (both in flight at once)
    int32_t slot_rows[kSlotBatch];
    if constexpr (kSource == QuantSource::kScatter) load_slot_rows<kSlotBatch>(p, t.r, 0, in_tile, slot_rows);
    constexpr bool kSiluMul = kSource == QuantSource::kSiluMul;
    const Slice<T> slice = load_group_slice<T, kAligned, kSiluMul>(t.src, p.up_offset, live);

    // Scatter: encode for each slot's expert, store at the slot's row
    if constexpr (kSource == QuantSource::kScatter) {
      scatter_nvfp4<T, kSwizzled, kAligned>(p, slice, t.r, t.c, live, in_tile, t.col / 2, slot_rows);
      return;
    }

    // Reduce amax, scale byte, quantize (NVFP4: with the encode scale of the batch, or of the
    // row's expert)
    float global_scale = 0.0f;
    if constexpr (Format::kFp4) {
      global_scale = encode_scale(p, p.global_scale_by_row_expert ? (live ? __ldg(p.row_map + t.r) : 0) : b);
    }
    const BlockGroup<kFormat> out = quantize_block_group<T, kFormat>(slice, global_scale);

    // Store q, and the scale byte (0 in the padding slots)
    if (live) store_block_q<kFormat, kAligned>(t.dst, out);
    if (in_tile && sub == 0) *t.scale = live ? static_cast<uint8_t>(out.scale) : 0;
  };

  // The block's tile; with kWalk (a masked SiLU-and-mul launch whose grid is capped: walk_blocks)
  // every tile of every batch that its walk finds needed
  if constexpr (kWalk) {
    const auto first_row = [&](int32_t tile) {
      return static_cast<int32_t>(p.row_slots.divide(static_cast<uint32_t>(tile * kTeams)));
    };
    walk_tiles(p, first_row, [&](int32_t tile, int32_t b) {
      quantize_tile(mx_team_slot<T, kFormat, kSwizzled>(p, tile * kTeams, b, sub), tile * kTeams, b);
    });
  } else {
    quantize_tile(t, block_unit, b);
  }
}

// Launch the kernel of one instantiation on `stream` (kScatter: the token blocks, then the
// padding blocks; kChunked: a warp a chunk).
template <class Arch, typename T, BlockFormat kFormat, bool kSwizzled, bool kAligned, QuantSource kSource,
          bool kChunked = false>
fp8quant_status_t launch_block_scaled_quant_as(BlockScaledProblem& problem, cudaStream_t stream) {
  constexpr auto kernel = block_scaled_quant_kernel<Arch, T, kFormat, kSwizzled, kAligned, kSource, kChunked>;
  dim3 grid;
  if constexpr (kChunked) {
    problem.chunks = (problem.slots + kChunkSlots - 1) / kChunkSlots;
    problem.chunk_units = problem.rows * problem.chunks;  // at most units: no overflow
    problem.row_chunks = FastDivisor(static_cast<uint32_t>(problem.chunks));
    grid = dim3((problem.chunk_units + kMxWarps - 1) / kMxWarps, problem.batch);
  } else {
    constexpr int kTeams = kMxThreads / FormatOf<kFormat>::kTeam;
    grid = token_and_padding_grid<kPadSlots>(problem, kTeams, problem.slots, kSource == QuantSource::kScatter);
    if constexpr (kSource == QuantSource::kSiluMul) {
      constexpr auto walker =
          block_scaled_quant_kernel<Arch, T, kFormat, kSwizzled, kAligned, kSource, false, /*kWalk=*/true>;
      const int64_t wave =
          problem.row_counts != nullptr ? int64_t{problem.sm_count} * resident_blocks_per_sm<walker, kMxThreads>() : 0;
      if (const uint32_t walkers = walk_blocks(problem, wave); walkers > 0) {
        return cuda_error(launch_with_pdl(walker, dim3(walkers), dim3(kMxThreads), stream, problem, problem.pdl),
                          "kernel launch");
      }
    }
  }
  return cuda_error(launch_with_pdl(kernel, grid, dim3(kMxThreads), stream, problem, problem.pdl), "kernel launch");
}

// Whether `problem` takes NVFP4's chunks: plain rows of at least a chunk's slots, in a launch of
// more teams than the device holds threads at once (2048 an SM). Below that the launch is bound
// by latency, not instruction issue: one group a thread spreads a row over more warps and SMs,
// where a chunk's warp converts its kChunkGroups groups one after another.
inline bool nvfp4_chunks(const BlockScaledProblem& p) {
  return p.format == BlockFormat::kNvfp4 && p.source == QuantSource::kRows && p.slots >= kChunkSlots &&
         int64_t{p.units} * p.batch > int64_t{p.sm_count} * 2048;
}

// Launch the kernel for `problem` on `stream` (the C API has checked every value). The dispatch
// source is built for NVFP4 only: the format whose per-expert encode scales need it.
template <class Arch>
fp8quant_status_t launch_block_scaled_quant(const BlockScaledProblem& problem_in, cudaStream_t stream) {
  BlockScaledProblem problem = problem_in;
  return FP8QUANT_DISPATCH_DTYPE(problem.dtype, T, [&] {
    return FP8QUANT_DISPATCH_BOOL(problem.layout == FP8QUANT_MX_SCALE_SWIZZLED, kSwizzled, [&] {
      return FP8QUANT_DISPATCH_BOOL(problem.aligned, kAligned, [&] {
        if (problem.source == QuantSource::kScatter) {
          if (problem.format != BlockFormat::kNvfp4) return no_kernel_for("format", static_cast<int>(problem.format));
          return launch_block_scaled_quant_as<Arch, T, BlockFormat::kNvfp4, kSwizzled, kAligned, QuantSource::kScatter>(
              problem, stream);
        }
        if (nvfp4_chunks(problem)) {
          return launch_block_scaled_quant_as<Arch, T, BlockFormat::kNvfp4, kSwizzled, kAligned, QuantSource::kRows,
                                              true>(problem, stream);
        }
        return FP8QUANT_DISPATCH_BLOCK_FORMAT(problem.format, kFormat, [&] {
          return FP8QUANT_DISPATCH_BOOL(problem.source == QuantSource::kSiluMul, kSiluMul, [&] {
            constexpr QuantSource kSource = kSiluMul ? QuantSource::kSiluMul : QuantSource::kRows;
            return launch_block_scaled_quant_as<Arch, T, kFormat, kSwizzled, kAligned, kSource>(problem, stream);
          });
        });
      });
    });
  });
}

}  // namespace fp8quant::kernels
