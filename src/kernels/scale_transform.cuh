// Scale transforms: one thread per 4-byte element of the destination buffer, padding included,
// in memory order (stores coalesce); sources are read through strides, so one kernel serves
// every pair of layouts. Scale buffers are small (a [4096, 7168] activation has 229 KiB of fp32
// scales), so the strided reads of a transposition stay in L2 and the kernel is launch-bound.
//
// Programmatic dependent launch: nothing touches global memory before griddepcontrol.wait
// (docs/kernels.md).
#pragma once

#include <cuda_runtime.h>

#include <algorithm>
#include <cstdint>

#include "common/dispatch.hpp"
#include "common/error.hpp"
#include "common/launch.cuh"
#include "common/math.cuh"
#include "kernels/scale_transform.hpp"

namespace fp8quant::kernels {

constexpr int kScaleTransformThreads = 256;
constexpr int64_t kScaleTransformMaxBlocks = 1 << 16;  // more elements loop (grid stride)

// Record the flat source index of a value that did not convert; the smallest one wins.
__device__ __forceinline__ void report_invalid(unsigned long long* first_invalid, int64_t index) {
  if (first_invalid != nullptr) atomicMin(first_invalid, static_cast<unsigned long long>(index));
}

template <class Arch, ScaleTransform kOp, bool kDstRowMajor>
__global__ void __launch_bounds__(kScaleTransformThreads)
    scale_transform_kernel(const __grid_constant__ ScaleTransformProblem p) {
  // Wait for the previous kernel's writes; let the next kernel launch
  asm volatile("griddepcontrol.wait;" ::: "memory");
  asm volatile("griddepcontrol.launch_dependents;");

  const auto* src = static_cast<const uint32_t*>(p.src);
  auto* dst = static_cast<uint32_t*>(p.dst);
  const int64_t step = int64_t{gridDim.x} * kScaleTransformThreads;
  for (int64_t i = int64_t{blockIdx.x} * kScaleTransformThreads + threadIdx.x; i < p.total; i += step) {
    // Locate the destination element
    const int64_t b = i / p.dst_batch_stride;
    const int64_t rem = i - b * p.dst_batch_stride;
    const int64_t r = kDstRowMajor ? rem / p.dst_cols : rem % p.dst_rows;
    const int64_t c = kDstRowMajor ? rem % p.dst_cols : rem / p.dst_rows;

    // Convert; padding rows stay 0
    uint32_t out = 0u;
    if (r < p.rows) {
      const int64_t sr = r / p.row_div;
      const uint32_t* row = src + b * p.src_batch_stride + sr * p.src_row_stride;
      const int64_t flat = (b * p.src_rows + sr) * p.groups;  // index of the row's group 0
      if constexpr (kOp == ScaleTransform::kConvert) {
        out = __ldg(row + c * p.src_col_stride);
      } else if constexpr (kOp == ScaleTransform::kPack) {
#pragma unroll
        for (int j = 0; j < 4; ++j) {
          const int64_t g = 4 * c + j;
          if (g < p.groups) {
            const uint32_t e = math::ue8m0_byte(__uint_as_float(__ldg(row + g * p.src_col_stride)));
            if (e == math::kUE8M0NaN) report_invalid(p.first_invalid, flat + g);
            out |= e << (8 * j);
          }
        }
      } else {  // kUnpack
        const uint32_t e = (__ldg(row + (c / 4) * p.src_col_stride) >> (8 * (c % 4))) & 0xFFu;
        if (e == math::kUE8M0NaN) report_invalid(p.first_invalid, flat + c);
        out = math::ue8m0_byte_bits(e);
      }
    }

    // Store
    dst[i] = out;
  }
}

template <class Arch, ScaleTransform kOp, bool kDstRowMajor>
fp8quant_status_t launch_scale_transform_as(const ScaleTransformProblem& p, cudaStream_t stream) {
  const int64_t blocks =
      std::min((p.total + kScaleTransformThreads - 1) / kScaleTransformThreads, kScaleTransformMaxBlocks);
  const auto kernel = scale_transform_kernel<Arch, kOp, kDstRowMajor>;
  return cuda_error(
      launch_with_pdl(kernel, dim3(static_cast<unsigned>(blocks)), dim3(kScaleTransformThreads), stream, p, p.pdl),
      "kernel launch");
}

// Launch the kernel instantiated for `problem` on `stream` (packing always writes MN-major words).
template <class Arch>
fp8quant_status_t launch_scale_transform(const ScaleTransformProblem& problem, cudaStream_t stream) {
  return FP8QUANT_DISPATCH_SCALE_TRANSFORM(problem.op, kOp, [&] {
    if constexpr (kOp == ScaleTransform::kPack) {
      return launch_scale_transform_as<Arch, kOp, false>(problem, stream);
    } else {
      return FP8QUANT_DISPATCH_BOOL(problem.dst_row_major, kDstRowMajor, [&] {
        return launch_scale_transform_as<Arch, kOp, kDstRowMajor>(problem, stream);
      });
    }
  });
}

}  // namespace fp8quant::kernels
