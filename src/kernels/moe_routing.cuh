// MoE routing metadata in two kernels, deterministic and without atomics on the layout:
//   count   one block per local expert counts its slots (counts[e]);
//   place   one block per local expert sums the aligned counts of the experts before it (its
//           first row), counts its slots again and gives the i-th of them in flat order rank i:
//           row, token, masked row; then marks its padding rows. One more block marks the
//           dropped slots and the rows past M_sum, and reports a bound that was too small in the
//           status word.
// Each thread of a block owns one strip of consecutive slots; strip totals are scanned across
// the block once, so the only synchronization is one scan per kernel. Every block reads all
// t * k ids (L1- and L2-resident: 128 KiB at t = 4096, k = 8), so the work grows with
// experts * slots: suited to decode and to prefill chunks up to a few hundred thousand slots.
//
// Programmatic dependent launch: nothing touches global memory before griddepcontrol.wait
// (docs/kernels.md); the placement kernel's wait also orders it after the count kernel.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

#include "common/dispatch.hpp"
#include "common/error.hpp"
#include "common/launch.cuh"
#include "fp8quant/moe.h"
#include "kernels/moe_routing.hpp"

namespace fp8quant::kernels {

constexpr int kRoutingThreads = 1024;  // strips of 32 slots at t * k = 32768: one 128-byte line each
constexpr int kRoutingWarps = kRoutingThreads / 32;

// The local expert of slot s, or -1 for a dropped slot.
template <typename IdT>
__device__ __forceinline__ int64_t local_expert(const RoutingProblem& p, int32_t s) {
  const int64_t id = static_cast<int64_t>(static_cast<const IdT*>(p.topk_ids)[s]);
  const int64_t e = id - p.expert_offset;
  return id < 0 || e < 0 || e >= p.experts ? -1 : e;
}

// Sum over the block (every thread calls it; all get the total).
__device__ __forceinline__ int64_t block_sum(int64_t v, int64_t* smem) {
#pragma unroll
  for (int offset = 16; offset > 0; offset /= 2) v += __shfl_xor_sync(0xFFFFFFFFu, v, offset);
  __syncthreads();  // smem may still be read by a previous call
  if (threadIdx.x % 32 == 0) smem[threadIdx.x / 32] = v;
  __syncthreads();
  int64_t total = 0;
#pragma unroll
  for (int w = 0; w < kRoutingWarps; ++w) total += smem[w];
  return total;
}

// Sum of v over the threads before this one (every thread calls it).
__device__ __forceinline__ int32_t block_exclusive_scan(int32_t v, int32_t* smem) {
  const int lane = threadIdx.x % 32, warp = threadIdx.x / 32;
  int32_t inclusive = v;
#pragma unroll
  for (int offset = 1; offset < 32; offset *= 2) {
    const int32_t up = __shfl_up_sync(0xFFFFFFFFu, inclusive, offset);
    if (lane >= offset) inclusive += up;
  }
  if (lane == 31) smem[warp] = inclusive;
  __syncthreads();
  int32_t before = 0;
#pragma unroll
  for (int w = 0; w < kRoutingWarps; ++w) before += w < warp ? smem[w] : 0;
  return before + inclusive - v;
}

// This thread's strip of slots, [begin, end).
struct Strip {
  int32_t begin, end;
};
__device__ __forceinline__ Strip strip(const RoutingProblem& p) {
  const int32_t per = (p.slots + kRoutingThreads - 1) / kRoutingThreads;
  const int32_t begin = min(static_cast<int32_t>(threadIdx.x) * per, p.slots);
  return {begin, min(begin + per, p.slots)};
}

// visit(s, expert) for each slot of the strip in order, its ids loaded kBatch at a time.
template <typename IdT, typename Visit>
__device__ __forceinline__ void for_each_slot(const RoutingProblem& p, Strip st, Visit&& visit) {
  constexpr int kBatch = 8;
  for (int32_t base = st.begin; base < st.end; base += kBatch) {
    int64_t experts[kBatch];
#pragma unroll
    for (int i = 0; i < kBatch; ++i) experts[i] = base + i < st.end ? local_expert<IdT>(p, base + i) : -1;
#pragma unroll
    for (int i = 0; i < kBatch; ++i) {
      if (base + i < st.end) visit(base + i, experts[i]);
    }
  }
}

__device__ __forceinline__ int64_t aligned_count(const RoutingProblem& p, int32_t e) {
  const int64_t c = p.counts[e];
  return (c + p.align - 1) / p.align * p.align;
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
  for_each_slot<IdT>(p, strip(p), [&](int32_t, int64_t x) { mine += x == e; });
  const int64_t count = block_sum(mine, partial);
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
  const Strip st = strip(p);

  // Wait for the count kernel
  asm volatile("griddepcontrol.wait;" ::: "memory");
  asm volatile("griddepcontrol.launch_dependents;");

  // First row of this expert: the aligned counts of the experts before it
  int64_t before = 0;
  for (int32_t i = threadIdx.x; i < e; i += kRoutingThreads) before += aligned_count(p, i);
  const int64_t first_row = block_sum(before, partial);

  if (e == p.experts) {
    // Dropped slots; rows past M_sum; the bound on M_sum
    for_each_slot<IdT>(p, st, [&](int32_t s, int64_t x) {
      if (x < 0) {
        p.inv_perm[s] = -1;
        if (p.masked_row != nullptr) p.masked_row[s] = -1;
      }
    });
    for (int64_t r = first_row + threadIdx.x; r < p.rows; r += kRoutingThreads) {
      p.m_indices[r] = -1;
      p.row_token[r] = -1;
    }
    if (threadIdx.x == 0) {
      p.row_offsets[p.experts] = static_cast<int32_t>(min(first_row, int64_t{INT32_MAX}));
      if (first_row > p.rows) atomicOr(p.status, FP8QUANT_ROUTING_ROWS_OVERFLOW);
    }
    return;
  }
  if (threadIdx.x == 0) p.row_offsets[e] = static_cast<int32_t>(min(first_row, int64_t{INT32_MAX}));

  // Rank of the strip's first slot of this expert: its slots in the strips before
  int32_t mine = 0;
  for_each_slot<IdT>(p, st, [&](int32_t, int64_t x) { mine += x == e; });
  int64_t rank = block_exclusive_scan(mine, warp_totals);

  // Place the strip's slots of this expert in order
  bool rows_overflow = false, max_m_overflow = false;
  for_each_slot<IdT>(p, st, [&](int32_t s, int64_t x) {
    if (x != e) return;
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
    ++rank;
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

// Launch both kernels for `problem` on `stream`.
template <class Arch>
fp8quant_status_t launch_moe_routing(const RoutingProblem& problem, cudaStream_t stream) {
  return FP8QUANT_DISPATCH_BOOL(problem.int64_ids, kInt64, [&] {
    using IdT = std::conditional_t<kInt64, int64_t, int32_t>;
    const auto count = moe_count_kernel<Arch, IdT>;
    const auto place = moe_place_kernel<Arch, IdT>;
    FP8QUANT_RETURN_IF_ERROR(cuda_error(
        launch_with_pdl(count, dim3(problem.experts), dim3(kRoutingThreads), stream, problem, problem.pdl),
        "kernel launch"));
    return cuda_error(
        launch_with_pdl(place, dim3(problem.experts + 1), dim3(kRoutingThreads), stream, problem, problem.pdl),
        "kernel launch");
  });
}

}  // namespace fp8quant::kernels
