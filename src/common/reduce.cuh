// Reductions across lanes and warps, one spelling for every kernel: a butterfly of xor shuffles
// inside a warp, and warp results folded through shared memory in warp order across a block.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

namespace fp8quant {

constexpr unsigned kFullMask = 0xFFFFFFFFu;

struct MaxOp {
  __device__ __forceinline__ float operator()(float a, float b) const { return fmaxf(a, b); }
};

struct SumOp {
  template <typename V>
  __device__ __forceinline__ V operator()(V a, V b) const {
    return a + b;
  }
};

// op over each aligned run of kLanes lanes (a team; 32: the warp), by xor shuffles from kLanes / 2
// down to 1; every lane of the run gets the result. Every lane of the warp calls it.
template <int kLanes, typename V, typename Op>
__device__ __forceinline__ V warp_reduce(V v, Op op) {
  static_assert(kLanes >= 1 && kLanes <= 32 && (kLanes & (kLanes - 1)) == 0, "a power of two up to 32");
#pragma unroll
  for (int offset = kLanes / 2; offset > 0; offset /= 2) v = op(v, __shfl_xor_sync(kFullMask, v, offset));
  return v;
}

// op over a block of kWarps warps, the warps' results folded in warp order: each warp reduces
// its lanes, lane 0 writes smem[warp], and every thread folds smem[0 .. kWarps). With kReused,
// the block first waits for any earlier read of smem. Every thread calls it.
template <int kWarps, bool kReused = false, typename V, typename Op>
__device__ __forceinline__ V block_reduce(V v, Op op, V* smem) {
  v = warp_reduce<32>(v, op);
  if constexpr (kReused) __syncthreads();
  if (threadIdx.x % 32 == 0) smem[threadIdx.x / 32] = v;
  __syncthreads();
  V total = smem[0];
#pragma unroll
  for (int w = 1; w < kWarps; ++w) total = op(total, smem[w]);
  return total;
}

}  // namespace fp8quant
