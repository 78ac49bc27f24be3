// MoE routing metadata in two kernels, deterministic and without atomics on the layout:
//   count   one block per local expert scans every slot and counts its own (counts[e]);
//   place   one block per local expert sums the aligned counts of the experts before it (its
//           first row), scans the slots again in order and gives the i-th of its slots rank i
//           (ballots within a warp, warp totals through shared memory): row, token, masked
//           row; then marks its padding rows. One more block marks the dropped slots and the
//           rows past M_sum, and reports a bound that was too small in the status word.
// Every scan reads the t * k ids once per block (L2-resident: 128 KiB at t = 4096, k = 8).
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

constexpr int kRoutingThreads = 256;
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
  for (int32_t s = threadIdx.x; s < p.slots; s += kRoutingThreads) mine += local_expert<IdT>(p, s) == e;
  const int64_t count = block_sum(mine, partial);
  if (threadIdx.x == 0) {
    p.counts[e] = static_cast<int32_t>(count);
    if (e == 0) *p.status = FP8QUANT_ROUTING_OK;
  }
}

template <class Arch, typename IdT>
__global__ void __launch_bounds__(kRoutingThreads) moe_place_kernel(const __grid_constant__ RoutingProblem p) {
  __shared__ int64_t partial[kRoutingWarps];
  __shared__ int32_t warp_hits[kRoutingWarps];
  const int32_t e = blockIdx.x;  // == p.experts: the block of dropped slots and trailing rows
  const int lane = threadIdx.x % 32, warp = threadIdx.x / 32;

  // Wait for the count kernel
  asm volatile("griddepcontrol.wait;" ::: "memory");
  asm volatile("griddepcontrol.launch_dependents;");

  // First row of this expert: the aligned counts of the experts before it
  int64_t before = 0;
  for (int32_t i = threadIdx.x; i < e; i += kRoutingThreads) before += aligned_count(p, i);
  const int64_t first_row = block_sum(before, partial);

  if (e == p.experts) {
    // Dropped slots; rows past M_sum; the bound on M_sum
    for (int32_t s = threadIdx.x; s < p.slots; s += kRoutingThreads) {
      if (local_expert<IdT>(p, s) < 0) {
        p.inv_perm[s] = -1;
        if (p.masked_row != nullptr) p.masked_row[s] = -1;
      }
    }
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

  // Rank this expert's slots in flat order, chunk by chunk
  int64_t seen = 0;  // slots of this expert in earlier chunks
  bool rows_overflow = false, max_m_overflow = false;
  for (int32_t base = 0; base < p.slots; base += kRoutingThreads) {
    const int32_t s = base + threadIdx.x;
    const bool hit = s < p.slots && local_expert<IdT>(p, s) == e;
    const unsigned ballot = __ballot_sync(0xFFFFFFFFu, hit);
    if (lane == 0) warp_hits[warp] = __popc(ballot);
    __syncthreads();
    int64_t rank = seen + __popc(ballot & ((1u << lane) - 1u));
    int64_t chunk = 0;
#pragma unroll
    for (int w = 0; w < kRoutingWarps; ++w) {
      rank += w < warp ? warp_hits[w] : 0;
      chunk += warp_hits[w];
    }
    __syncthreads();  // warp_hits is rewritten by the next chunk
    seen += chunk;
    if (hit) {
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
  }
  if (rows_overflow) atomicOr(p.status, FP8QUANT_ROUTING_ROWS_OVERFLOW);
  if (max_m_overflow) atomicOr(p.status, FP8QUANT_ROUTING_MAX_M_OVERFLOW);

  // Padding rows of this expert
  const int64_t end = min(first_row + aligned_count(p, e), int64_t{p.rows});
  for (int64_t r = first_row + seen + threadIdx.x; r < end; r += kRoutingThreads) {
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
