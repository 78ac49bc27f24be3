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
// Rows m in [M, rows) and slots g >= G are padding: their teams load nothing and store zeros.
//
// Programmatic dependent launch: each block lets the next kernel in the stream launch once it
// may read x (after waiting for the previous kernel), so launches overlap. While they wait, the
// blocks of the first wave ask L2 to prefetch their part of x: with x in DRAM the loads after
// the wait then find it in L2, and DRAM works through the gap between two kernels. A prefetch is
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

template <class Arch, typename T, int kGroupSize, ScaleOrder kOrder, bool kUE8M0, bool kAligned,
          QuantSource kSource = QuantSource::kRows>
__global__ void __launch_bounds__(Arch::kBlockThreads)
    per_token_group_quant_kernel(const __grid_constant__ QuantProblem p) {
  constexpr int kTeam = kGroupSize / kElemsPerThread;
  constexpr bool kPacked = kOrder == ScaleOrder::kPacked;
  static_assert(kTeam >= 1 && kTeam * 4 <= 32, "four teams must fit in a warp");
  static_assert(Arch::kBlockThreads % 32 == 0, "blocks are whole warps (the shuffles use every lane)");
  static_assert(!kPacked || kUE8M0, "packed scales are UE8M0");
  const int teams_per_block = blockDim.x / kTeam;  // Arch::kBlockThreads or one warp: see block_threads

  // Locate this team's group and its addresses, while the block waits. The pin below keeps the
  // front end from moving them past the wait; ptxas may still sink the last steps of dst and
  // scale_dst after it (it does in the sm_90a bf16 kernels), a few instructions a thread
  const int sub = threadIdx.x % kTeam;
  const GroupPos pos = locate<row_tile(kOrder)>(p, blockIdx.x * teams_per_block + threadIdx.x / kTeam);
  const int64_t b = blockIdx.y;
  const int64_t k_offset = static_cast<int64_t>(pos.g) * kGroupSize + sub * kElemsPerThread;
  const T* src = static_cast<const T*>(p.x) + b * p.x_batch_stride + pos.m * p.x_row_stride + k_offset;  // kGather: later
  uint8_t* dst = static_cast<uint8_t*>(p.q) + b * p.q_batch_stride + pos.m * p.q_row_stride + k_offset;
  const int32_t col = kPacked ? pos.g / 4 : pos.g;
  using Scale = std::conditional_t<kPacked, uint32_t, float>;
  Scale* scale_dst = static_cast<Scale*>(p.scale) + b * p.scale_batch_stride +
                     (kOrder == ScaleOrder::kRow ? static_cast<int64_t>(pos.m) * p.num_groups + col
                                                    : static_cast<int64_t>(col) * p.rows + pos.m);
  asm("" : "+l"(src), "+l"(dst), "+l"(scale_dst));

  // Prefetch x into L2: the first wave only (later blocks load right away)
  const uint64_t block = uint64_t{blockIdx.y} * gridDim.x + blockIdx.x;  // batches x blocks can pass 2^32
  if (kSource != QuantSource::kGather && pos.valid && block < static_cast<uint64_t>(p.prefetch_blocks)) {
    prefetch_slice<T, kAligned>(src);
    if constexpr (kSource == QuantSource::kSiluMul) prefetch_slice<T, kAligned>(src + p.up_offset);
  }

  // Wait for the previous kernel's writes; let the next kernel launch
  asm volatile("griddepcontrol.wait;" ::: "memory");
  asm volatile("griddepcontrol.launch_dependents;");

  // Map the row: padding rows of the MoE layouts load nothing and store zeros
  bool live = pos.valid;
  if constexpr (kSource != QuantSource::kRows) {
    if (live) {
      int64_t entry = pos.m;
      if (p.row_counts != nullptr) {
        live = pos.m < __ldg(p.row_counts + b);
        if (p.row_starts != nullptr) entry += __ldg(p.row_starts + b);
      }
      if (live && p.row_map != nullptr) {
        const int32_t mapped = entry >= 0 && entry < p.map_entries ? __ldg(p.row_map + entry) : -1;
        live = mapped >= 0 && (kSource != QuantSource::kGather || mapped < p.gather_rows);
        if constexpr (kSource == QuantSource::kGather) {
          src = static_cast<const T*>(p.x) + int64_t{mapped} * p.x_row_stride + k_offset;
        }
      } else if (kSource == QuantSource::kGather) {
        live = false;  // a gather without a map has no rows
      }
    }
  }

  // Load
  Slice<T> slice;
  if (live) {
    load_slice<T, kAligned>(src, slice);
    if constexpr (kSource == QuantSource::kSiluMul) {
      Slice<T> up;
      load_slice<T, kAligned>(src + p.up_offset, up);
      silu_mul_slice(slice, up);
    }
  } else {
#pragma unroll
    for (int i = 0; i < Slice<T>::kWords; ++i) slice.w[i] = 0u;
  }

  // Reduce amax, scale, quantize
  const QuantizedSlice<kUE8M0> out = quantize_slice<T, kTeam, kUE8M0>(slice, p.eps);
  const float s = out.s;
  const uint32_t e = out.e;

  // Store q
  if (pos.valid) {
    if constexpr (kAligned) {
      *reinterpret_cast<uint4*>(dst) = make_uint4(out.q[0], out.q[1], out.q[2], out.q[3]);
    } else {
#pragma unroll
      for (int i = 0; i < kElemsPerThread; ++i) dst[i] = static_cast<uint8_t>(out.q[i / 4] >> (8 * (i % 4)));
    }
  }

  // Store scales
  if constexpr (kPacked) {
    uint32_t word = live ? e << (8 * (pos.g % 4)) : 0u;
    word |= __shfl_xor_sync(kFullMask, word, kTeam);
    word |= __shfl_xor_sync(kFullMask, word, 2 * kTeam);
    if (pos.in_range && sub == 0 && pos.g % 4 == 0) *scale_dst = word;
  } else {
    if (pos.in_range && sub == 0) *scale_dst = live ? s : 0.0f;
  }
}

// Blocks of kKernel one SM holds at once (its occupancy), asked once per kernel.
template <class Arch, auto kKernel>
int resident_blocks_per_sm() {
  static const int blocks = [] {
    int n = 0;
    if (cudaOccupancyMaxActiveBlocksPerMultiprocessor(&n, kKernel, Arch::kBlockThreads, 0) != cudaSuccess || n < 1) {
      cudaGetLastError();  // not sticky: fall back to the thread limit
      n = 2048 / Arch::kBlockThreads;
    }
    return n;
  }();
  return blocks;
}

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
  return FP8QUANT_DISPATCH_SCALE_ORDER(problem.layout, kOrder, [&] {
    return FP8QUANT_DISPATCH_BOOL(problem.ue8m0, kUE8M0, [&] {
      return FP8QUANT_DISPATCH_BOOL(problem.aligned, kAligned, [&] {
        if constexpr (kOrder == ScaleOrder::kPacked && !kUE8M0) {
          return no_kernel_for("ue8m0", 0);  // packed scales are UE8M0: the C API refuses this
        } else {
          constexpr int kTeam = kGroupSize / kElemsPerThread;
          constexpr auto kernel = per_token_group_quant_kernel<Arch, T, kGroupSize, kOrder, kUE8M0, kAligned, kSource>;
          problem.prefetch_blocks = problem.sm_count * resident_blocks_per_sm<Arch, kernel>();
          const int threads = block_threads<Arch, kTeam>(problem);
          const int teams_per_block = threads / kTeam;
          const dim3 grid((problem.units + teams_per_block - 1) / teams_per_block, problem.batch);
          return cuda_error(launch_with_pdl(kernel, grid, dim3(threads), stream, problem, problem.pdl),
                            "kernel launch");
        }
      });
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
