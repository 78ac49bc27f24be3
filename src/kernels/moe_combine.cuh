// MoE combine: one CTA row per token, each thread owning one 16-byte vector of the hidden
// dimension, accumulating its k expert rows in float32 in slot order (docs/contract.md, "MoE")
// and storing once. Reads k rows of y per token and writes one row of out.
//
// Programmatic dependent launch: nothing touches global memory before griddepcontrol.wait
// (docs/kernels.md).
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

#include "common/dispatch.hpp"
#include "common/error.hpp"
#include "common/launch.cuh"
#include "common/math.cuh"
#include "common/vec.cuh"
#include "kernels/moe_combine.hpp"

namespace fp8quant::kernels {

constexpr int kCombineThreads = 128;

template <class Arch, typename T, bool kAligned>
__global__ void __launch_bounds__(kCombineThreads) moe_combine_kernel(const __grid_constant__ CombineProblem p) {
  constexpr int kVec = 16 / sizeof(T);
  const int64_t t = blockIdx.x;
  const int32_t col = (static_cast<int32_t>(blockIdx.y) * kCombineThreads + static_cast<int32_t>(threadIdx.x)) * kVec;
  const int32_t n = min(kVec, p.h - col);  // <= 0 past the row's end

  // Wait for the previous kernel's writes; let the next kernel launch
  asm volatile("griddepcontrol.wait;" ::: "memory");
  asm volatile("griddepcontrol.launch_dependents;");
  if (n <= 0) return;

  // Accumulate the token's slots in order
  float acc[kVec];
#pragma unroll
  for (int i = 0; i < kVec; ++i) acc[i] = 0.0f;
  for (int32_t j = 0; j < p.k; ++j) {
    const int32_t r = __ldg(p.rows + t * p.k + j);
    const float w = __ldg(p.weights + t * p.k + j);
    if (r < 0 || r >= p.y_rows) continue;  // a dropped slot
    const T* src = static_cast<const T*>(p.y) + r * p.y_row_stride + col;
    float v[kVec];
    if constexpr (kAligned) {
      const Vec<16> raw = Vec<16>::load(src);
#pragma unroll
      for (int i = 0; i < 4; ++i) {
        if constexpr (sizeof(T) == 4) {
          v[i] = __uint_as_float(raw.w[i]);
        } else {
          const float2 f = math::unpack2(raw.w[i], T{});
          v[2 * i] = f.x;
          v[2 * i + 1] = f.y;
        }
      }
    } else {
#pragma unroll
      for (int i = 0; i < kVec; ++i) v[i] = i < n ? math::to_float(src[i]) : 0.0f;
    }
#pragma unroll
    for (int i = 0; i < kVec; ++i) acc[i] = __fadd_rn(acc[i], __fmul_rn(w, v[i]));
  }

  // Store
  T* dst = static_cast<T*>(p.out) + t * p.out_row_stride + col;
  if constexpr (kAligned) {
    T packed[kVec];
#pragma unroll
    for (int i = 0; i < kVec; ++i) packed[i] = math::from_float<T>(acc[i]);
    Vec<16> out;
    memcpy(out.w, packed, sizeof(out.w));
    out.store(dst);
  } else {
#pragma unroll
    for (int i = 0; i < kVec; ++i) {
      if (i < n) dst[i] = math::from_float<T>(acc[i]);
    }
  }
}

// Launch the kernel instantiated for `problem` on `stream`.
template <class Arch>
fp8quant_status_t launch_moe_combine(const CombineProblem& problem, cudaStream_t stream) {
  return FP8QUANT_DISPATCH_DTYPE(problem.dtype, T, [&] {
    return FP8QUANT_DISPATCH_BOOL(problem.aligned, kAligned, [&] {
      const dim3 grid(static_cast<unsigned>(problem.t), static_cast<unsigned>(problem.col_blocks));
      const auto kernel = moe_combine_kernel<Arch, T, kAligned>;
      return cuda_error(launch_with_pdl(kernel, grid, dim3(kCombineThreads), stream, problem, problem.pdl),
                        "kernel launch");
    });
  });
}

}  // namespace fp8quant::kernels
