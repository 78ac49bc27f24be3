// MoE routing metadata, deterministic and without atomics on the layout. The i-th slot of an
// expert in flat order gets rank i: row, token, masked row; the expert's padding rows and the
// rows past M_sum are marked -1, and a bound that was too small is reported in the status word.
//
// Up to kOneKernelExperts experts: one kernel. Every block counts all the slots per run in shared memory
// (shared atomics) and scans the aligned counts; then it places the slots of the runs it owns,
// walking them again (ranks within a step from ballots), and marks the rows that hold no token
// of its share: the padding rows of the experts dealt to its warps, and a slice of the rows past
// M_sum. The blocks repeat the counting (the ids, L2-resident: 512 KiB at t = 16384, k = 8) so
// that no block waits for another; the work grows with blocks * slots.
//
// More experts: two kernels.
//   count   one block per local expert counts its slots (counts[e]);
//   place   one block per local expert sums the aligned counts of the experts before it (its
//           first row), counts its slots again and places them in order; then marks its padding
//           rows. One more block marks the dropped slots and the rows past M_sum, and reports
//           the bounds.
// Each warp of a block owns one run of consecutive slots and walks it 32 slots a step, its lanes
// reading consecutive ids (one 128-byte access a step); a slot's rank within the run comes from
// ballots, and the runs' totals are summed across the block through shared memory (a few
// barriers per kernel, none per step). Every block reads all t * k ids, so the work grows with
// experts * slots.
//
// Programmatic dependent launch: nothing touches global memory before griddepcontrol.wait
// (docs/kernels.md); the placement kernel's wait also orders it after the count kernel.
#pragma once

#include <cuda_runtime.h>

#include <algorithm>
#include <cstdint>

#include "common/dispatch.hpp"
#include "common/error.hpp"
#include "common/launch.cuh"
#include "common/reduce.cuh"
#include "fp8quant/moe.h"
#include "kernels/moe_routing.hpp"

namespace fp8quant::kernels {

constexpr int kRoutingThreads = 1024;
constexpr int kRoutingWarps = kRoutingThreads / 32;

// The local expert of slot s, or -1 for a dropped slot.
template <typename IdT>
__device__ __forceinline__ int64_t local_expert(const RoutingProblem& p, int32_t s) {
  const int64_t id = static_cast<int64_t>(static_cast<const IdT*>(p.topk_ids)[s]);
  const int64_t e = id - p.expert_offset;
  return id < 0 || e < 0 || e >= p.experts ? -1 : e;
}

// This warp's run of slots, [begin, end): whole steps of 32, the last run cut at the end.
struct Run {
  int32_t begin, end;
};
__device__ __forceinline__ int32_t run_slots(const RoutingProblem& p) {
  return (p.slots + kRoutingThreads - 1) / kRoutingThreads * 32;
}
__device__ __forceinline__ Run warp_run(const RoutingProblem& p) {
  const int32_t per = run_slots(p);
  const int32_t begin = min(static_cast<int32_t>(threadIdx.x / 32) * per, p.slots);
  return {begin, min(begin + per, p.slots)};
}

// Runs that hold slots: the first ones, at most kRoutingWarps (none without slots; no sum that
// could pass INT32_MAX for slots near it).
__device__ __forceinline__ int32_t nonempty_runs(const RoutingProblem& p) {
  return p.slots == 0 ? 0 : (p.slots - 1) / run_slots(p) + 1;
}

// No slot: a lane past the end of its run.
constexpr int64_t kNoSlot = -2;

// visit(s, expert) on every lane for each step of the run in order (lane i at slot step + i;
// expert kNoSlot past the end; steps past the run's end are skipped), its ids loaded kBatch steps
// at a time. Every lane calls visit, so it may use warp votes.
template <typename IdT, typename Visit>
__device__ __forceinline__ void for_each_step(const RoutingProblem& p, Run run, Visit&& visit) {
  constexpr int kBatch = 8;
  const int32_t lane = threadIdx.x % 32;
  for (int32_t base = run.begin; base < run.end; base += 32 * kBatch) {
    int64_t experts[kBatch];
#pragma unroll
    for (int i = 0; i < kBatch; ++i) {
      const int32_t s = base + 32 * i + lane;
      experts[i] = s < run.end ? local_expert<IdT>(p, s) : kNoSlot;
    }
#pragma unroll
    for (int i = 0; i < kBatch; ++i) {
      if (base + 32 * i >= run.end) break;  // the same on every lane: no slot left in the run
      visit(base + 32 * i + lane, experts[i]);
    }
  }
}

__device__ __forceinline__ int64_t aligned_count(const RoutingProblem& p, int32_t e) {
  const int64_t c = p.counts[e];
  return (c + p.align - 1) / p.align * p.align;
}

// Clamp a row to int32 (a bound past it is reported in the status).
__device__ __forceinline__ int32_t clamp_row(int64_t r) { return static_cast<int32_t>(min(r, int64_t{INT32_MAX})); }

// Place slot s, the rank-th slot of expert e whose first row is first_row; note a bound it
// does not fit.
__device__ __forceinline__ void place_slot(const RoutingProblem& p, int32_t s, int32_t e, int64_t first_row,
                                           int64_t rank, bool& rows_overflow, bool& max_m_overflow) {
  const int64_t row = first_row + rank;
  if (row < p.rows) {
    p.inv_perm[s] = static_cast<int32_t>(row);
    p.m_indices[row] = e;
    p.row_token[row] = s / p.k;
  } else {
    p.inv_perm[s] = -1;
    rows_overflow = true;
  }
  if (p.masked_row != nullptr) {
    const bool fits = rank < p.max_m;
    p.masked_row[s] = fits ? static_cast<int32_t>(int64_t{e} * p.max_m + rank) : -1;
    max_m_overflow |= !fits;
  }
}

// Mark dropped slot s.
__device__ __forceinline__ void drop_slot(const RoutingProblem& p, int32_t s) {
  p.inv_perm[s] = -1;
  if (p.masked_row != nullptr) p.masked_row[s] = -1;
}

template <class Arch, typename IdT>
__global__ void __launch_bounds__(kRoutingThreads) moe_count_kernel(const __grid_constant__ RoutingProblem p) {
  __shared__ int64_t partial[kRoutingWarps];
  const int32_t e = blockIdx.x;

  // Wait for the previous kernel's writes; let the placement kernel launch
  asm volatile("griddepcontrol.wait;" ::: "memory");
  asm volatile("griddepcontrol.launch_dependents;");

  // Count this expert's slots
  int64_t mine = 0;
  for_each_step<IdT>(p, warp_run(p), [&](int32_t, int64_t x) { mine += x == e; });
  const int64_t count = block_reduce<kRoutingWarps, true>(mine, SumOp{}, partial);
  if (threadIdx.x == 0) {
    p.counts[e] = static_cast<int32_t>(count);
    if (e == 0) *p.status = FP8QUANT_ROUTING_OK;
  }
}

template <class Arch, typename IdT>
__global__ void __launch_bounds__(kRoutingThreads) moe_place_kernel(const __grid_constant__ RoutingProblem p) {
  __shared__ int64_t partial[kRoutingWarps];
  __shared__ int32_t warp_totals[kRoutingWarps];
  const int32_t e = blockIdx.x;  // == p.experts: the block of dropped slots and trailing rows
  const int32_t lane = threadIdx.x % 32, warp = threadIdx.x / 32;
  const Run run = warp_run(p);

  // Wait for the count kernel
  asm volatile("griddepcontrol.wait;" ::: "memory");
  asm volatile("griddepcontrol.launch_dependents;");

  // First row of this expert: the aligned counts of the experts before it
  int64_t before = 0;
  for (int32_t i = threadIdx.x; i < e; i += kRoutingThreads) before += aligned_count(p, i);
  const int64_t first_row = block_reduce<kRoutingWarps, true>(before, SumOp{}, partial);

  if (e == p.experts) {
    // Dropped slots; rows past M_sum; the bound on M_sum
    for_each_step<IdT>(p, run, [&](int32_t s, int64_t x) {
      if (x == -1) drop_slot(p, s);
    });
    for (int64_t r = first_row + threadIdx.x; r < p.rows; r += kRoutingThreads) {
      p.m_indices[r] = -1;
      p.row_token[r] = -1;
    }
    if (threadIdx.x == 0) {
      p.row_offsets[p.experts] = clamp_row(first_row);
      if (first_row > p.rows) atomicOr(p.status, FP8QUANT_ROUTING_ROWS_OVERFLOW);
    }
    return;
  }
  if (threadIdx.x == 0) p.row_offsets[e] = clamp_row(first_row);

  // Rank of the run's first slot of this expert: its slots in the runs before
  int32_t mine = 0;
  for_each_step<IdT>(p, run, [&](int32_t, int64_t x) { mine += x == e; });
  mine = warp_reduce<32>(mine, SumOp{});
  if (lane == 0) warp_totals[warp] = mine;
  __syncthreads();
  int64_t rank = 0;
  for (int w = 0; w < warp; ++w) rank += warp_totals[w];

  // Place the run's slots of this expert in order: each step's hits ranked by a ballot
  bool rows_overflow = false, max_m_overflow = false;
  for_each_step<IdT>(p, run, [&](int32_t s, int64_t x) {
    const bool hit = x == e;
    const unsigned ballot = __ballot_sync(kFullMask, hit);
    if (hit) place_slot(p, s, e, first_row, rank + __popc(ballot & ((1u << lane) - 1u)), rows_overflow, max_m_overflow);
    rank += __popc(ballot);
  });
  if (rows_overflow) atomicOr(p.status, FP8QUANT_ROUTING_ROWS_OVERFLOW);
  if (max_m_overflow) atomicOr(p.status, FP8QUANT_ROUTING_MAX_M_OVERFLOW);

  // Padding rows of this expert
  const int64_t count = p.counts[e];
  const int64_t end = min(first_row + aligned_count(p, e), int64_t{p.rows});
  for (int64_t r = first_row + count + threadIdx.x; r < end; r += kRoutingThreads) {
    p.m_indices[r] = -1;
    p.row_token[r] = -1;
  }
}

constexpr int32_t kOneKernelExperts = 512;  // the per-run counts fit shared memory
constexpr int32_t kOneKernelRowsPerBlock = 1024;
// Dynamic shared memory the one-kernel routing takes without opting in to more (the default limit
// is 48 KiB with its static arrays; 256 experts' counts fit)
constexpr size_t kDefaultMaxDynamicSmem = 32 * 1024;
constexpr int32_t kOneKernelMaxBlocks = 128;

// Whether the one-kernel routing takes `p`.
inline bool routing_in_one_kernel(const RoutingProblem& p) { return p.experts <= kOneKernelExperts; }

// Dynamic shared memory of the one-kernel routing: the per-run counts, kRoutingWarps x experts.
inline size_t routing_counts_bytes(const RoutingProblem& p) {
  return size_t{kRoutingWarps} * static_cast<size_t>(p.experts) * sizeof(uint32_t);
}

// The lanes of the warp whose expert equals x (x in [kNoSlot, kOneKernelExperts)): one ballot
// per bit of x - kNoSlot.
__device__ __forceinline__ unsigned lanes_with_expert(int64_t x) {
  constexpr int kBits = 10;
  static_assert(kOneKernelExperts - kNoSlot <= (1 << kBits), "every expert and both marks fit the key");
  const uint32_t key = static_cast<uint32_t>(x - kNoSlot);
  unsigned peers = kFullMask;
#pragma unroll
  for (int bit = 0; bit < kBits; ++bit) {
    const bool set = key >> bit & 1u;
    const unsigned lanes = __ballot_sync(kFullMask, set);
    peers &= set ? lanes : ~lanes;
  }
  return peers;
}

template <class Arch, typename IdT>
__global__ void __launch_bounds__(kRoutingThreads) moe_route_kernel(const __grid_constant__ RoutingProblem p) {
  extern __shared__ uint32_t run_counts[];  // [kRoutingWarps][experts]: per run; after the scan, in the runs before
  __shared__ int64_t first[kOneKernelExperts + 1];  // first row of each expert; [experts]: M_sum
  __shared__ int32_t count[kOneKernelExperts];
  __shared__ int64_t warp_sums[kRoutingWarps];
  const int32_t lane = threadIdx.x % 32, warp = threadIdx.x / 32;
  const unsigned lanes_before = (1u << lane) - 1u;
  const Run run = warp_run(p);
  const int32_t runs = nonempty_runs(p);
  uint32_t* const earlier = run_counts + warp * p.experts;  // this warp's run
  if (warp < runs) {
    for (int32_t e = lane; e < p.experts; e += 32) earlier[e] = 0;
  }
  __syncwarp();

  // Wait for the previous kernel's writes; let the next kernel launch
  asm volatile("griddepcontrol.wait;" ::: "memory");
  asm volatile("griddepcontrol.launch_dependents;");

  // Count each run's slots per expert (shared atomics)
  for_each_step<IdT>(p, run, [&](int32_t, int64_t x) {
    if (x >= 0) atomicAdd(&earlier[x], 1u);
  });
  __syncthreads();

  // Count each expert; per run, keep its slots in the runs before
  for (int32_t e = threadIdx.x; e < p.experts; e += kRoutingThreads) {
    uint32_t total = 0;
    for (int w = 0; w < runs; ++w) {
      const uint32_t c = run_counts[w * p.experts + e];
      run_counts[w * p.experts + e] = total;
      total += c;
    }
    count[e] = total;
  }
  __syncthreads();

  // Scan the aligned counts: first rows (one expert per thread)
  const int32_t e = threadIdx.x;
  int64_t rows_through = e < p.experts ? (int64_t{count[e]} + p.align - 1) / p.align * p.align : 0;
#pragma unroll
  for (int offset = 1; offset < 32; offset *= 2) {
    const int64_t v = __shfl_up_sync(kFullMask, rows_through, offset);
    if (lane >= offset) rows_through += v;
  }
  if (lane == 31) warp_sums[warp] = rows_through;
  __syncthreads();
  if (e < p.experts) {
    for (int w = 0; w < warp; ++w) rows_through += warp_sums[w];
    first[e + 1] = rows_through;
  }
  if (e == 0) first[0] = 0;
  const bool max_m_overflow = __syncthreads_or(p.masked_row != nullptr && e < p.experts && count[e] > p.max_m);
  const int64_t m_sum = first[p.experts];

  // Counts, first rows and status (block 0)
  if (blockIdx.x == 0) {
    if (e < p.experts) {
      p.counts[e] = count[e];
      p.row_offsets[e] = clamp_row(first[e]);
    }
    if (e == 0) {
      p.row_offsets[p.experts] = clamp_row(m_sum);
      *p.status = (m_sum > p.rows ? FP8QUANT_ROUTING_ROWS_OVERFLOW : 0) |
                  (max_m_overflow ? FP8QUANT_ROUTING_MAX_M_OVERFLOW : 0);
    }
  }

  // Place the slots of the runs this block owns, in order (the status has the bounds already)
  if (warp % gridDim.x == blockIdx.x) {
    bool rows_overflow = false, m_overflow = false;
    for_each_step<IdT>(p, run, [&](int32_t s, int64_t x) {
      const unsigned peers = lanes_with_expert(x);
      if (x >= 0) {
        place_slot(p, s, static_cast<int32_t>(x), first[x], int64_t{earlier[x]} + __popc(peers & lanes_before),
                   rows_overflow, m_overflow);
      } else if (x == -1) {
        drop_slot(p, s);
      }
      __syncwarp();
      if (x >= 0 && lane == __ffs(peers) - 1) earlier[x] += __popc(peers);
      __syncwarp();
    });
  }

  // Mark the rows that hold no token: the padding rows of each expert (one warp an expert, the
  // experts dealt round robin to the warps of all blocks), and this block's slice of the rows past
  // M_sum
  for (int32_t x = blockIdx.x * kRoutingWarps + warp; x < p.experts; x += gridDim.x * kRoutingWarps) {
    const int64_t end = min(first[x + 1], int64_t{p.rows});
    for (int64_t r = first[x] + count[x] + lane; r < end; r += 32) {
      p.m_indices[r] = -1;
      p.row_token[r] = -1;
    }
  }
  const uint32_t tail = static_cast<uint32_t>(max(int64_t{p.rows} - m_sum, int64_t{0}));
  const int64_t slice = (tail + gridDim.x - 1) / gridDim.x;  // 32-bit: rows fit int32
  const int64_t tail_end = min(m_sum + (blockIdx.x + 1) * slice, int64_t{p.rows});
  for (int64_t r = m_sum + blockIdx.x * slice + threadIdx.x; r < tail_end; r += kRoutingThreads) {
    p.m_indices[r] = -1;
    p.row_token[r] = -1;
  }
}

// Launch the routing kernels for `problem` on `stream`.
template <class Arch>
fp8quant_status_t launch_moe_routing(const RoutingProblem& problem, cudaStream_t stream) {
  return FP8QUANT_DISPATCH_BOOL(problem.int64_ids, kInt64, [&] {
    using IdT = std::conditional_t<kInt64, int64_t, int32_t>;
    if (routing_in_one_kernel(problem)) {
      const auto kernel = moe_route_kernel<Arch, IdT>;
      const int64_t blocks = std::clamp<int64_t>(
          (int64_t{problem.rows} + kOneKernelRowsPerBlock - 1) / kOneKernelRowsPerBlock, 1, kOneKernelMaxBlocks);
      const size_t smem = routing_counts_bytes(problem);
      if (smem > kDefaultMaxDynamicSmem) {
        // Past the default limit: opt in, on the current device (so at every launch), to the most
        // any launch takes (so that no other thread's launch lowers it between this one's two calls)
        constexpr int kMaxSmem = kRoutingWarps * kOneKernelExperts * sizeof(uint32_t);
        FP8QUANT_RETURN_IF_ERROR(
            cuda_error(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, kMaxSmem),
                       "cudaFuncSetAttribute"));
      }
      return cuda_error(launch_with_pdl(kernel, dim3(static_cast<unsigned>(blocks)), dim3(kRoutingThreads), stream,
                                        problem, problem.pdl, smem),
                        "kernel launch");
    }
    const auto count = moe_count_kernel<Arch, IdT>;
    const auto place = moe_place_kernel<Arch, IdT>;
    FP8QUANT_RETURN_IF_ERROR(
        cuda_error(launch_with_pdl(count, dim3(problem.experts), dim3(kRoutingThreads), stream, problem, problem.pdl),
                   "kernel launch"));
    return cuda_error(
        launch_with_pdl(place, dim3(problem.experts + 1), dim3(kRoutingThreads), stream, problem, problem.pdl),
        "kernel launch");
  });
}

}  // namespace fp8quant::kernels
