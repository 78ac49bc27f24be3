// RMSNorm of rows, after an optional residual add, written in x's dtype or quantized in groups
// into the GEMM's scale layout (docs/contract.md, "RMSNorm"), in one pass over memory.
//
// Work split: one block per row (grid.x covers the scale layout's rows, padding included), one
// 16-element slice per thread: thread i holds elements [16 i, 16 i + 16) of the row, so a team of
// group_size / 16 consecutive threads holds one quantization group, as in the group quantizer.
// Threads past h / 16 (the rest of the last warp) hold zeros; blocks of the TMA-aligned layouts'
// padding rows load nothing and store zero scales.
//
// The sum of squares follows the contract's order, which this split makes cheap: each thread
// sums its slice in order, each warp folds its 32 lanes by halves (shuffles by 16, 8, 4, 2, 1),
// and the warp totals, zero-padded to a power of two W, fold by halves the same way (W / 2 .. 1).
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
#include "kernels/block_scaled_group.cuh"
#include "kernels/group_slice.cuh"
#include "kernels/rms_norm.hpp"

namespace fp8quant::kernels {

static_assert(kElemsPerThread == kNormSliceElems, "one slice per thread");

// The row's sum of squares, in the contract's order (every thread calls it; all get the sum).
__device__ __forceinline__ float row_sum_of_squares(float partial, int fold_warps, float* warp_totals) {
  const int lane = threadIdx.x % 32, warp = threadIdx.x / 32;
  partial = warp_reduce<32>(partial, SumOp{});
  if (lane == 0) warp_totals[warp] = partial;
  __syncthreads();
  float total = lane < static_cast<int>(blockDim.x / 32) ? warp_totals[lane] : 0.0f;
  for (int offset = fold_warps / 2; offset > 0; offset /= 2) total += __shfl_xor_sync(kFullMask, total, offset);
  return __shfl_sync(kFullMask, total, 0);
}

// Where this thread's slice lies: row m (blockIdx.x), slice i (threadIdx.x), live when it holds
// data, and its addresses in x, the residual and the weight.
template <typename T>
struct RowSlice {
  int32_t m;
  int32_t slice;
  bool live;
  int64_t col;
  const T* x;
  T* residual;
  const T* weight;
};

template <typename T>
__device__ __forceinline__ RowSlice<T> locate_slice(const NormProblem& p) {
  RowSlice<T> at;
  at.m = blockIdx.x;
  at.slice = threadIdx.x;
  at.live = at.m < p.m && at.slice < p.slices;
  at.col = int64_t{at.slice} * kElemsPerThread;
  at.x = static_cast<const T*>(p.x) + at.m * p.x_row_stride + at.col;
  at.residual = static_cast<T*>(p.residual) + at.m * p.residual_row_stride + at.col;
  at.weight = static_cast<const T*>(p.weight) + at.col;
  return at;
}

// Load this thread's slice of its row (x, after adding the residual, which is stored back) and
// normalize it: y in x's dtype, zeros where the thread holds no data. Every thread of the block
// calls it, after griddepcontrol.wait.
template <typename T, bool kResidual>
__device__ __forceinline__ Slice<T> normalize_row(const NormProblem& p, const RowSlice<T>& at, float* warp_totals) {
  // Load; add the residual and store the sum back into it
  Slice<T> h, w;
#pragma unroll
  for (int i = 0; i < Slice<T>::kWords; ++i) h.w[i] = w.w[i] = 0u;
  if (at.live) {
    load_slice<T, true>(at.x, h);
    load_slice<T, true>(at.weight, w);
    if constexpr (kResidual) {
      Slice<T> r;
      load_slice<T, true>(at.residual, r);
#pragma unroll
      for (int i = 0; i < Slice<T>::kWords; ++i) h.w[i] = math::add2<T>(h.w[i], r.w[i]);
      store_words(at.residual, h.w);
    }
  }

  // Sum of squares: the slice in order, a fused multiply-add each (one rounding a term), then the folds
  float v[kElemsPerThread];
  unpack_slice(h, v);
  float partial = 0.0f;
#pragma unroll
  for (int i = 0; i < kElemsPerThread; ++i) partial = __fmaf_rn(v[i], v[i], partial);
  const float r = math::rms_inverse(row_sum_of_squares(partial, p.fold_warps, warp_totals), p.h, p.eps);

  // Normalize
  Slice<T> y;
#pragma unroll
  for (int i = 0; i < Slice<T>::kWords; ++i) y.w[i] = math::normalize2<T>(h.w[i], r, w.w[i]);
  return y;
}

template <class Arch, typename T, bool kResidual, bool kQuantize, int kGroupSize, ScaleOrder kOrder, bool kUE8M0>
__global__ void __launch_bounds__(kNormMaxThreads) rms_norm_kernel(const __grid_constant__ NormProblem p) {
  constexpr int kTeam = kGroupSize / kElemsPerThread;
  constexpr bool kPacked = kOrder == ScaleOrder::kPacked;
  static_assert(sizeof(T) == 2, "bf16 and fp16 rows");
  static_assert(kTeam >= 1 && kTeam * 4 <= 32, "four teams must fit in a warp");
  __shared__ float warp_totals[32];

  // Locate this thread's slice and group
  const RowSlice<T> at = locate_slice<T>(p);
  const int32_t m = at.m, slice = at.slice;
  const bool live = at.live;
  const int64_t col = at.col;

  // Wait for the previous kernel's writes; let the next kernel launch
  asm volatile("griddepcontrol.wait;" ::: "memory");
  asm volatile("griddepcontrol.launch_dependents;");

  const Slice<T> y = normalize_row<T, kResidual>(p, at, warp_totals);

  if constexpr (!kQuantize) {
    // Store y
    if (live) store_words(static_cast<T*>(p.out) + m * p.out_row_stride + col, y.w);
  } else {
    // Reduce amax, scale, quantize (padding slots hold zeros and store nothing)
    const QuantizedSlice<kUE8M0> out = quantize_slice<T, kTeam, kUE8M0>(y, p.quant_eps);

    // Store q
    if (live) {
      store_words(static_cast<uint8_t*>(p.out) + m * p.out_row_stride + col, out.q);
    }

    // Store scales: the first thread of each team; padding rows and groups get zeros
    const int32_t g = slice / kTeam;
    const bool first = slice % kTeam == 0;
    const bool real = m < p.m && g < p.num_groups;
    if constexpr (kPacked) {
      uint32_t word = real ? out.e << (8 * (g % 4)) : 0u;
      word |= __shfl_xor_sync(kFullMask, word, kTeam);
      word |= __shfl_xor_sync(kFullMask, word, 2 * kTeam);
      const int32_t words = (p.num_groups + 3) / 4;
      if (first && g % 4 == 0 && g / 4 < words) static_cast<uint32_t*>(p.scale)[int64_t{g / 4} * p.rows + m] = word;
    } else if (first && g < p.num_groups) {
      const int64_t at = kOrder == ScaleOrder::kRow ? int64_t{m} * p.num_groups + g : int64_t{g} * p.rows + m;
      static_cast<float*>(p.scale)[at] = real ? out.s : 0.0f;
    }
  }
}

// RMSNorm quantized to a block-scaled format (MXFP8, NVFP4): a team of threads quantizes each
// group of the normalized row, with its scale byte in the MX scale layout. Blocks of the swizzled
// layout's padding rows, and the threads of its padding slots, store zero bytes.
template <class Arch, typename T, bool kResidual, BlockFormat kFormat, bool kSwizzled>
__global__ void __launch_bounds__(kNormMaxThreads) rms_norm_block_scaled_kernel(const __grid_constant__ NormProblem p) {
  using Format = FormatOf<kFormat>;
  static_assert(sizeof(T) == 2, "bf16 and fp16 rows");
  __shared__ float warp_totals[32];

  // Locate this thread's slice and group
  const RowSlice<T> at = locate_slice<T>(p);
  const int32_t m = at.m, slice = at.slice, c = at.slice / Format::kTeam;
  const bool live = at.live;

  // Wait for the previous kernel's writes; let the next kernel launch
  asm volatile("griddepcontrol.wait;" ::: "memory");
  asm volatile("griddepcontrol.launch_dependents;");

  const Slice<T> y = normalize_row<T, kResidual>(p, at, warp_totals);

  // Reduce amax, scale byte, quantize
  float global_scale = 0.0f;
  if constexpr (Format::kFp4) global_scale = __ldg(p.global_scale);
  const BlockGroup<kFormat> out = quantize_block_group<T, kFormat>(y, global_scale);

  // Store q
  if (live) {
    uint8_t* q = static_cast<uint8_t*>(p.out) + m * p.out_row_stride + int64_t{slice} * Format::kQBytes;
    store_block_q<kFormat, true>(q, out);
  }

  // Store the scale byte: the first thread of each team; padding rows and slots get 0
  if (slice % Format::kTeam == 0 && c < p.slots) {
    const bool real = m < p.m && c < p.num_groups;
    p.scale_bytes[mx_scale_offset<kSwizzled>(p.slots, m, c)] = real ? static_cast<uint8_t>(out.scale) : 0;
  }
}

// Launch the kernel of one instantiation on `stream`: one block per row of whole warps.
template <class Arch, typename T, bool kResidual, bool kQuantize, int kGroupSize, ScaleOrder kOrder, bool kUE8M0>
fp8quant_status_t launch_rms_norm_as(const NormProblem& problem, cudaStream_t stream) {
  constexpr auto kernel = rms_norm_kernel<Arch, T, kResidual, kQuantize, kGroupSize, kOrder, kUE8M0>;
  const int threads = (problem.slices + 31) / 32 * 32;
  return cuda_error(launch_with_pdl(kernel, dim3(problem.rows), dim3(threads), stream, problem, problem.pdl),
                    "kernel launch");
}

// Launch the block-scaled kernel of one instantiation on `stream`: one block per scale row,
// threads for every slice and every scale slot.
template <class Arch, typename T, bool kResidual, BlockFormat kFormat, bool kSwizzled>
fp8quant_status_t launch_rms_norm_block_scaled_as(const NormProblem& problem, cudaStream_t stream) {
  constexpr auto kernel = rms_norm_block_scaled_kernel<Arch, T, kResidual, kFormat, kSwizzled>;
  const int32_t data_threads = max(problem.slices, problem.slots * FormatOf<kFormat>::kTeam);
  const int threads = (data_threads + 31) / 32 * 32;
  return cuda_error(launch_with_pdl(kernel, dim3(problem.rows), dim3(threads), stream, problem, problem.pdl),
                    "kernel launch");
}

// Launch the kernel for `problem` on `stream` (the C API has checked every value).
template <class Arch>
fp8quant_status_t launch_rms_norm(const NormProblem& problem, cudaStream_t stream) {
  return FP8QUANT_DISPATCH_DTYPE(problem.dtype, T, [&] {
    if constexpr (sizeof(T) != 2) {
      return no_kernel_for("dtype", problem.dtype);  // the C API refuses float32
    } else {
      return FP8QUANT_DISPATCH_BOOL(problem.residual != nullptr, kResidual, [&] {
        if (problem.block_scaled) {
          return FP8QUANT_DISPATCH_BLOCK_FORMAT(problem.format, kFormat, [&] {
            return FP8QUANT_DISPATCH_BOOL(problem.mx_layout == FP8QUANT_MX_SCALE_SWIZZLED, kSwizzled, [&] {
              return launch_rms_norm_block_scaled_as<Arch, T, kResidual, kFormat, kSwizzled>(problem, stream);
            });
          });
        }
        if (!problem.quantize) {
          return launch_rms_norm_as<Arch, T, kResidual, false, 128, ScaleOrder::kRow, false>(problem, stream);
        }
        return FP8QUANT_DISPATCH_GROUP_SIZE(problem.group_size, kGroupSize, [&] {
          return FP8QUANT_DISPATCH_SCALE_FORMAT(problem.layout, problem.ue8m0, kOrder, kUE8M0, [&] {
            return launch_rms_norm_as<Arch, T, kResidual, true, kGroupSize, kOrder, kUE8M0>(problem, stream);
          });
        });
      });
    }
  });
}

}  // namespace fp8quant::kernels
