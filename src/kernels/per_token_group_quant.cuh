// Fused per-token-group FP8 quantization: one pass reads x once, writes q once and writes each
// group's scale straight into the GEMM's layout (padding included).
//
// Work split: a team of kGroupSize / 16 consecutive threads owns one group, 16 elements per
// thread (two or four 16-byte loads, one 16-byte store). Teams walk the (row m, group slot g)
// grid so that each warp stores its scales together and each block reads contiguous runs of x:
//   row          scale[m * G + g]                 row by row, g fastest
//   mn, mn_tma   scale[g * rows + m]              tiles of four rows, m fastest, then g
//   packed_ue8m0 byte g % 4 of word scale[(g / 4) * rows + m]; row by row, slots run to
//                4 * ceil(G / 4), and the four teams of a word sit in one warp and merge their
//                bytes by shuffles.
// The MoE sources walk row by row in every layout (team_row_tile): the scatter source's rows go
// to scattered destination rows, where a warp's four consecutive groups of a token make one
// 512-byte store, and the SiLU-and-mul source's live rows fill whole warps.
// Rows m in [M, rows) and slots g >= G are padding: their teams load nothing and store zeros.
// The MoE sources (QuantProblem) read SiLU-and-mul of x's rows, or walk the tokens and store
// each at its slots' rows (scatter); their rows without a token get zero scales inside a GEMM
// tile and nothing else. A block's teams take one tile of units, except in a masked SiLU-and-mul
// launch over many rows: its grid is capped at about two waves (walk_blocks), and the blocks walk
// the tiles of all batches together, each visiting those of its share that hold rows (kWalk,
// walk_tiles). A masked launch of at most kFixupsLastMaxRows rows a batch holds few live rows, a
// warp or so on an SM: its SiLU takes silu_mul_slice's fix-ups-last form (kFixupsLast), whose
// chains interleave.
//
// Programmatic dependent launch: each block lets the next kernel in the stream launch once it
// may read x (after waiting for the previous kernel), so launches overlap. While they wait, the
// blocks of the first wave (none in a masked SiLU-and-mul launch of a block a tile: most of its
// rows hold no token) ask L2 to prefetch their part of x: with x in DRAM the loads after
// the wait then find it in L2, and DRAM works through the gap between two kernels. A dispatch
// (kScatter) follows the routing, whose kernels leave DRAM idle for microseconds: its first wave
// prefetches the parts of the next kScatterPrefetchWaves - 1 waves too. A prefetch is
// only a hint and cannot change what a load reads: L2 is where every SM's writes meet, so the
// previous kernel's writes to x land in the prefetched lines. Nothing else touches global memory
// before the wait (docs/kernels.md: no store, not even of padding, before griddepcontrol.wait).
#pragma once

#include <cuda_runtime.h>

#include <cstdint>
#include <type_traits>

#include "common/dispatch.hpp"
#include "common/error.hpp"
#include "common/fast_divisor.hpp"
#include "common/launch.cuh"
#include "common/math.cuh"
#include "kernels/group_slice.cuh"
#include "kernels/moe_rows.cuh"
#include "kernels/per_token_group_quant.hpp"

namespace fp8quant::kernels {

// Where a team's group lies, and whether it is a real group or padding.
struct GroupPos {
  int32_t m;      // row of the scale layout (rows >= M are padding)
  int32_t g;      // group slot in the row (slots >= G are padding)
  bool in_range;  // a slot of the scale layout: m < rows (the last block may have spare teams)
  bool valid;     // a real group: m < M and g < G
};

// The group of team `unit`: tiles of kRowTile rows one after another, m fastest inside a tile.
template <int kRowTile>
__device__ __forceinline__ GroupPos locate(const QuantProblem& p, int32_t unit) {
  const int32_t tile = static_cast<int32_t>(p.tile_units.divide(static_cast<uint32_t>(unit)));
  const int32_t within = unit - tile * static_cast<int32_t>(p.tile_units.divisor());
  GroupPos pos;
  pos.m = tile * kRowTile + within % kRowTile;
  pos.g = within / kRowTile;
  pos.in_range = pos.m < p.rows;
  pos.valid = pos.m < p.m && pos.g < p.num_groups;
  return pos;
}

// The scale of group column `col` of row m in batch b (a word of four when packed), for a layout
// of `rows` rows per batch.
template <ScaleOrder kOrder, typename Scale>
__device__ __forceinline__ Scale* scale_at(const QuantProblem& p, int64_t b, int64_t m, int32_t col, int32_t rows) {
  return static_cast<Scale*>(p.scale) + b * p.scale_batch_stride +
         (kOrder == ScaleOrder::kRow ? m * p.num_groups + col : static_cast<int64_t>(col) * rows + m);
}

// A team's group (lane `sub` of it) in batch b, and its addresses: x's slice, q's and the scale's.
template <typename T, typename Scale>
struct TeamSlot {
  GroupPos pos;
  int64_t k_offset;  // elements into the row
  int32_t col;       // scale column (a packed word's)
  const T* src;
  uint8_t* dst;
  Scale* scale_dst;
};

template <typename T, typename Scale, int kGroupSize, ScaleOrder kOrder, int kRowTile>
__device__ __forceinline__ TeamSlot<T, Scale> team_slot(const QuantProblem& p, int32_t unit, int64_t b, int sub) {
  TeamSlot<T, Scale> t;
  t.pos = locate<kRowTile>(p, unit);
  t.k_offset = static_cast<int64_t>(t.pos.g) * kGroupSize + sub * kElemsPerThread;
  t.src = static_cast<const T*>(p.x) + b * p.x_batch_stride + t.pos.m * p.x_row_stride + t.k_offset;
  t.dst = static_cast<uint8_t*>(p.q) + b * p.q_batch_stride + t.pos.m * p.q_row_stride + t.k_offset;
  t.col = kOrder == ScaleOrder::kPacked ? t.pos.g / 4 : t.pos.g;
  t.scale_dst = scale_at<kOrder, Scale>(p, b, t.pos.m, t.col, p.rows);
  return t;
}

// Store a team's group: its q slice at dst when `live`, its scale at scale_dst when
// `store_scale` (0 unless `live`). Every lane calls it: the four teams of a packed word merge
// their bytes by shuffles, and the first of them stores the word. kScattered (the dispatch's
// destination rows): q streams past L2, where its lines would push out the scale lines that
// later rows complete a word at a time, and the scales ask L2 to keep theirs.
template <int kTeam, ScaleOrder kOrder, bool kUE8M0, bool kAligned, bool kScattered = false, typename Scale>
__device__ __forceinline__ void store_group(uint8_t* dst, Scale* scale_dst, const QuantizedSlice<kUE8M0>& out,
                                            int32_t g, int sub, bool live, bool store_scale) {
  constexpr Cache kQCache = kScattered ? Cache::kStreaming : Cache::kDefault;
  const auto put_scale = [&](Scale value) {
    if constexpr (kScattered) {
      Vec<4>{{math::bits_as<uint32_t>(value)}}.store<Cache::kEvictLast>(scale_dst);
    } else {
      *scale_dst = value;
    }
  };
  if (live) {
    if constexpr (kAligned) {
      store_words<kElemsPerThread / 4, kQCache>(dst, out.q);
    } else {
#pragma unroll
      for (int i = 0; i < kElemsPerThread; ++i) dst[i] = static_cast<uint8_t>(out.q[i / 4] >> (8 * (i % 4)));
    }
  }
  if constexpr (kOrder == ScaleOrder::kPacked) {
    uint32_t word = live ? out.e << (8 * (g % 4)) : 0u;
    word |= __shfl_xor_sync(kFullMask, word, kTeam);
    word |= __shfl_xor_sync(kFullMask, word, 2 * kTeam);
    if (store_scale && sub == 0 && g % 4 == 0) put_scale(word);
  } else {
    if (store_scale && sub == 0) put_scale(live ? out.s : 0.0f);
  }
}

// How a team loads x. The dispatch (kScatter) reads each token once, and in the column layouts
// its x lines would otherwise stay in L2 beside the scale lines that later slots complete a word
// at a time (store_group): there it streams. With row-major scales, a slot's scales share
// sectors, and streaming x measured slower (docs/benchmarks-history.md, eighteenth run).
constexpr Cache x_cache(ScaleOrder order, QuantSource source) {
  return source == QuantSource::kScatter && order != ScaleOrder::kRow ? Cache::kStreaming : Cache::kReadOnly;
}

// Waves of x a dispatch's first wave prefetches, its own included: three gain most after the
// routing (docs/benchmarks-history.md, twenty-third run).
constexpr int32_t kScatterPrefetchWaves = 3;

// Scale columns of a row: group columns, or packed words of four.
template <ScaleOrder kOrder>
__host__ __device__ __forceinline__ int32_t scale_columns(const QuantProblem& p) {
  return kOrder == ScaleOrder::kPacked ? p.slots / 4 : p.num_groups;
}

// Scale columns one block of kScatter's padding part zeroes (the part has kPadColumns-wide
// chunks of every expert's columns, one block each).
constexpr int32_t kPadColumns = 8;

// One block of kScatter's padding part: the scales of expert e's tile padding rows set to 0 in
// columns [c0, c0 + kPadColumns) (QuantProblem: contiguous rows [row_starts[e] + count,
// row_starts[e + 1]), masked rows [count, align_up(count, pad_align)) of batch e), clamped to the
// layout's rows. Threads walk adjacent scales: the rows of one column at a time, or with row-major
// scales the chunk's columns of one row at a time.
template <ScaleOrder kOrder>
__device__ __forceinline__ void zero_tile_padding(const QuantProblem& p, int32_t e, int32_t c0) {
  using Scale = std::conditional_t<kOrder == ScaleOrder::kPacked, uint32_t, float>;
  const TilePadding pad = tile_padding(p, e, p.dest_rows);
  const int32_t c1 = min(c0 + kPadColumns, scale_columns<kOrder>(p));
  if constexpr (kOrder == ScaleOrder::kRow) {
    const int32_t width = c1 - c0;
    const int64_t count = int64_t{pad.last - pad.first} * width;
    for (int64_t i = threadIdx.x; i < count; i += blockDim.x) {
      const int32_t m = pad.first + static_cast<int32_t>(i / width);
      *scale_at<kOrder, Scale>(p, pad.b, m, c0 + static_cast<int32_t>(i % width), p.dest_rows) = Scale{0};
    }
  } else {
    for (int32_t col = c0; col < c1; ++col) {
      for (int32_t m = pad.first + static_cast<int32_t>(threadIdx.x); m < pad.last;
           m += static_cast<int32_t>(blockDim.x)) {
        *scale_at<kOrder, Scale>(p, pad.b, m, col, p.dest_rows) = Scale{0};
      }
    }
  }
}

template <class Arch, typename T, int kGroupSize, ScaleOrder kOrder, bool kUE8M0, bool kAligned,
          QuantSource kSource = QuantSource::kRows, bool kWalk = false, bool kFixupsLast = false>
__global__ void __launch_bounds__(Arch::kBlockThreads)
    per_token_group_quant_kernel(const __grid_constant__ QuantProblem p) {
  constexpr int kTeam = kGroupSize / kElemsPerThread;
  constexpr bool kPacked = kOrder == ScaleOrder::kPacked;
  static_assert(kTeam >= 1 && kTeam * 4 <= 32, "four teams must fit in a warp");
  static_assert(Arch::kBlockThreads % 32 == 0, "blocks are whole warps (the shuffles use every lane)");
  static_assert(!kPacked || kUE8M0, "packed scales are UE8M0");
  static_assert(!kWalk || kSource == QuantSource::kSiluMul, "only the SiLU-and-mul source walks block tiles");
  static_assert(!kFixupsLast || kSource == QuantSource::kSiluMul, "kFixupsLast is a form of the SiLU");
  const int teams_per_block = blockDim.x / kTeam;  // Arch::kBlockThreads or one warp: see block_threads
  using Scale = std::conditional_t<kPacked, uint32_t, float>;

  if constexpr (kSource == QuantSource::kScatter) {
    const auto zero = [&](int32_t e, int32_t c0) { zero_tile_padding<kOrder>(p, e, c0); };
    if (padding_block<kPadColumns>(p, zero)) return;
  }

  // Locate this team's group and its addresses, while the block waits (kWalk: in the block's
  // first tile of the walk, walk_tiles). The pin below keeps the front end from moving them past
  // the wait; ptxas may still sink the last steps of t.dst and t.scale_dst after it (it does in
  // the sm_90a bf16 kernels), a few instructions a thread
  const int sub = threadIdx.x % kTeam;
  constexpr int32_t kRowTile = team_row_tile(kOrder, kSource);
  const auto slot_of = [&](int32_t block_unit, int64_t b) {
    return team_slot<T, Scale, kGroupSize, kOrder, kRowTile>(p, block_unit + threadIdx.x / kTeam, b, sub);
  };
  int32_t block_unit = blockIdx.x * teams_per_block;
  int64_t b = blockIdx.y;
  if constexpr (kWalk) {
    const int32_t tile = blockIdx.x / p.batch;
    block_unit = tile * teams_per_block;
    b = blockIdx.x - tile * p.batch;
  }
  TeamSlot<T, Scale> t = slot_of(block_unit, b);
  asm("" : "+l"(t.src), "+l"(t.dst), "+l"(t.scale_dst));

  // Prefetch x into L2: the first wave only (later blocks load right away)
  const uint64_t block = uint64_t{blockIdx.y} * gridDim.x + blockIdx.x;  // batches x blocks can pass 2^32
  if (t.pos.valid && block < static_cast<uint64_t>(p.prefetch_blocks)) {
    prefetch_slice<T, kAligned>(t.src);
    if constexpr (kSource == QuantSource::kSiluMul) prefetch_slice<T, kAligned>(t.src + p.up_offset);
  }
  if constexpr (kSource == QuantSource::kScatter) {  // and the slices of the waves after it
    for (int32_t j = 1; j < kScatterPrefetchWaves && block < static_cast<uint64_t>(p.prefetch_blocks); ++j) {
      const int64_t ahead = block_unit + int64_t{j} * p.prefetch_blocks * teams_per_block;
      if (ahead >= p.units) break;
      const TeamSlot<T, Scale> a = slot_of(static_cast<int32_t>(ahead), b);
      if (a.pos.valid) prefetch_slice<T, kAligned>(a.src);
    }
  }

  // Wait for the previous kernel's writes; let the next kernel launch
  asm volatile("griddepcontrol.wait;" ::: "memory");
  asm volatile("griddepcontrol.launch_dependents;");

  // Quantize the team's group of the block tile that starts at unit block_unit of batch b
  const auto quantize_tile = [&](const TeamSlot<T, Scale>& t, int32_t block_unit, int64_t b) {
    // Map the row: padding rows of the MoE layouts load nothing, and only those in a tile store
    // their (zero) scales; a block whose rows all lie past them is done (its first row is the
    // lowest: units run tile after tile)
    bool live = t.pos.valid, in_tile = t.pos.in_range;
    if constexpr (kSource == QuantSource::kSiluMul) {
      if (narrow_to_moe_rows(p, b, locate<kRowTile>(p, block_unit).m, t.pos.m, live, in_tile)) return;
      // A warp of padding rows stores zero scales (inside a tile) and nothing else: what the
      // quantization of zeros below would store, without the work
      if (__all_sync(kFullMask, !live)) {
        store_group<kTeam, kOrder, kUE8M0, kAligned>(t.dst, t.scale_dst, QuantizedSlice<kUE8M0>{}, t.pos.g, sub, false,
                                                     in_tile);
        return;
      }
    }

    // Load x's group, and with the scatter source the first of its token's slot rows (both in
    // flight at once)
    int32_t slot_rows[kSlotBatch];
    if constexpr (kSource == QuantSource::kScatter) load_slot_rows<kSlotBatch>(p, t.pos.m, 0, live, slot_rows);
    constexpr bool kSiluMul = kSource == QuantSource::kSiluMul;
    const Slice<T> slice =
        load_group_slice<T, kAligned, kSiluMul, x_cache(kOrder, kSource), kFixupsLast>(t.src, p.up_offset, live);

    // Reduce amax, scale, quantize
    const QuantizedSlice<kUE8M0> out = quantize_slice<T, kTeam, kUE8M0>(slice, p.eps);

    // Store q and scales: at the team's own row, or at each of its token's slot rows
    if constexpr (kSource == QuantSource::kScatter) {
      // The slots' rows kSlotBatch at a time, all loads before the stores
      const int64_t dest_total = int64_t{p.dest_batch} * p.dest_m;
      for (int32_t j0 = 0; j0 < p.slots_per_row; j0 += kSlotBatch) {  // the same count on every lane
        if (j0 > 0) load_slot_rows<kSlotBatch>(p, t.pos.m, j0, live, slot_rows);
#pragma unroll
        for (int i = 0; i < kSlotBatch; ++i) {
          if (j0 + i >= p.slots_per_row) break;  // warp-uniform
          const int32_t row = slot_rows[i];
          const bool keep = row >= 0 && row < dest_total;
          const int32_t db = keep && p.dest_batch > 1 ? row / p.dest_m : 0, dm = keep ? row - db * p.dest_m : 0;
          uint8_t* slot_dst =
              static_cast<uint8_t*>(p.q) + int64_t{db} * p.q_batch_stride + int64_t{dm} * p.q_row_stride + t.k_offset;
          store_group<kTeam, kOrder, kUE8M0, kAligned, /*kScattered=*/true>(
              slot_dst, scale_at<kOrder, Scale>(p, db, dm, t.col, p.dest_rows), out, t.pos.g, sub, keep, keep);
        }
      }
    } else {
      store_group<kTeam, kOrder, kUE8M0, kAligned>(t.dst, t.scale_dst, out, t.pos.g, sub, live, in_tile);
    }
  };

  // The block's tile; with kWalk (a masked SiLU-and-mul launch whose grid is capped: walk_blocks)
  // every tile of every batch that its walk finds needed
  if constexpr (kWalk) {
    const auto first_row = [&](int32_t tile) { return locate<kRowTile>(p, tile * teams_per_block).m; };
    walk_tiles(p, first_row, [&](int32_t tile, int32_t b) {
      quantize_tile(slot_of(tile * teams_per_block, b), tile * teams_per_block, b);
    });
  } else {
    quantize_tile(t, block_unit, b);
  }
}

// Rows a batch up to which a masked SiLU-and-mul launch of a block a tile takes the SiLU's
// fix-ups-last form (launch_group_quant_as).
constexpr int32_t kFixupsLastMaxRows = 4;

// Threads per block: Arch::kBlockThreads, or one warp when the whole launch is at most two warps
// of teams per SM (M <= 16 at K = 7168). Whole blocks would crowd such a launch onto a few SMs
// (M = 1: 56 groups in two blocks), each reading and converting its share alone; single-warp
// blocks spread it over as many SMs as it has warps. Beyond two warps per SM, more single-warp
// blocks cost more to launch than they save (the measurements: docs/benchmarks-history.md, third
// run, "Block size for small launches"). The first wave (prefetch_blocks) is counted in whole
// blocks, several per SM; a single-warp launch has at most two blocks per SM, so all of it
// prefetches.
template <class Arch, int kTeam>
int block_threads(const QuantProblem& p) {
  constexpr int kWarpTeams = 32 / kTeam;
  constexpr int kMaxWarpsPerSm = 2;
  const int64_t warps = (int64_t{p.units} + kWarpTeams - 1) / kWarpTeams * p.batch;
  return warps <= int64_t{kMaxWarpsPerSm} * p.sm_count ? 32 : Arch::kBlockThreads;
}

// Launch the kernel of one instantiation (every template value fixed) on `stream`.
template <class Arch, typename T, int kGroupSize, QuantSource kSource>
fp8quant_status_t launch_group_quant_as(QuantProblem& problem, cudaStream_t stream) {
  return FP8QUANT_DISPATCH_SCALE_FORMAT(problem.layout, problem.ue8m0, kOrder, kUE8M0, [&] {
    return FP8QUANT_DISPATCH_BOOL(problem.aligned, kAligned, [&] {
      constexpr int kTeam = kGroupSize / kElemsPerThread;
      constexpr auto kernel = per_token_group_quant_kernel<Arch, T, kGroupSize, kOrder, kUE8M0, kAligned, kSource>;
      problem.prefetch_blocks = problem.sm_count * resident_blocks_per_sm<kernel, Arch::kBlockThreads>();
      const int threads = block_threads<Arch, kTeam>(problem);
      dim3 grid = token_and_padding_grid<kPadColumns>(problem, threads / kTeam, scale_columns<kOrder>(problem),
                                                      kSource == QuantSource::kScatter);
      auto launched = kernel;
      if constexpr (kSource == QuantSource::kSiluMul) {
        constexpr auto walker =
            per_token_group_quant_kernel<Arch, T, kGroupSize, kOrder, kUE8M0, kAligned, kSource, /*kWalk=*/true>;
        const int64_t wave = problem.row_counts != nullptr
                                 ? int64_t{problem.sm_count} * resident_blocks_per_sm<walker, Arch::kBlockThreads>()
                                 : 0;
        if (const uint32_t walkers = walk_blocks(problem, wave); walkers > 0) {
          problem.prefetch_blocks = static_cast<int32_t>(wave);  // the walker's own first wave
          return cuda_error(launch_with_pdl(walker, dim3(walkers), dim3(threads), stream, problem, problem.pdl),
                            "kernel launch");
        }
        // A masked launch of a block a tile prefetches nothing: its first wave holds the first
        // rows of every batch, most of them without a token (at T = 1, 8 live rows of 256), and
        // without the prefetch it measured faster at T = 1-16 (larger T walk). With at most
        // kFixupsLastMaxRows rows a batch its live rows are a warp or so on each SM that holds
        // one, and the SiLU's fix-ups-last form, whose chains interleave, measured faster (T = 1
        // and 4; slower at T = 16) (docs/benchmarks-history.md, twenty-sixth to twenty-eighth
        // runs)
        if (problem.row_counts != nullptr) {
          problem.prefetch_blocks = 0;
          if (problem.m <= kFixupsLastMaxRows) {
            launched = per_token_group_quant_kernel<Arch, T, kGroupSize, kOrder, kUE8M0, kAligned, kSource,
                                                    /*kWalk=*/false, /*kFixupsLast=*/true>;
          }
        }
      }
      return cuda_error(launch_with_pdl(launched, grid, dim3(threads), stream, problem, problem.pdl), "kernel launch");
    });
  });
}

// Launch the kernel instantiated for `problem` on `stream`. The MoE sources are built for
// groups of 128 only (DeepGEMM's grouped GEMMs read 1 x 128 scales), keeping the library's
// kernel count in check.
template <class Arch>
fp8quant_status_t launch_per_token_group_quant(const QuantProblem& problem_in, cudaStream_t stream) {
  QuantProblem problem = problem_in;
  return FP8QUANT_DISPATCH_QUANT_SOURCE(problem.source, kSource, [&] {
    return FP8QUANT_DISPATCH_DTYPE(problem.dtype, T, [&] {
      if constexpr (kSource == QuantSource::kRows) {
        return FP8QUANT_DISPATCH_GROUP_SIZE(problem.group_size, kGroupSize, [&] {
          return launch_group_quant_as<Arch, T, kGroupSize, kSource>(problem, stream);
        });
      } else {
        if (problem.group_size != 128) return no_kernel_for("group_size", problem.group_size);
        return launch_group_quant_as<Arch, T, 128, kSource>(problem, stream);
      }
    });
  });
}

}  // namespace fp8quant::kernels
