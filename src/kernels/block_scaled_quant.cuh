// Block-scaled quantization for Blackwell's tensor cores (docs/contract.md, "MXFP8" and "NVFP4"):
// one pass reads x once, writes q once and writes each group's scale byte straight into the
// scale layout (row-major, or swizzled, padding included), from the group quantizer's slice,
// team reduction and quantize cores.
//
// Work split: a team of kGroup / 16 consecutive threads owns one group (16 elements per thread:
// one or two 16-byte loads; MXFP8 stores 16 bytes a thread, NVFP4 8); teams walk the (row r, group
// slot c) grid slot by slot, so consecutive teams read consecutive groups of a row. Slots past
// the row's groups and rows past m (the swizzled layout's padding) load nothing and store a zero
// byte.
//
// Programmatic dependent launch: nothing touches global memory before griddepcontrol.wait
// (docs/kernels.md).
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

#include "common/dispatch.hpp"
#include "common/error.hpp"
#include "common/launch.cuh"
#include "kernels/block_scaled_quant.hpp"
#include "kernels/group_slice.cuh"

namespace fp8quant::kernels {

constexpr int kMxThreads = 256;

template <BlockFormat kFormat>
struct FormatOf {
  static constexpr bool kFp4 = kFormat == BlockFormat::kNvfp4;
  static constexpr int kGroup = kFp4 ? kNvfp4Group : kMxGroup;
  static constexpr int kTeam = kGroup / kElemsPerThread;
  static constexpr int kQBytes = kFp4 ? kElemsPerThread / 2 : kElemsPerThread;  // q bytes a thread
};

// Byte offset of scale (r, c) in one batch's buffer.
template <bool kSwizzled>
__device__ __forceinline__ int64_t mx_scale_offset(const BlockScaledProblem& p, int32_t r, int32_t c) {
  if constexpr (kSwizzled) {
    return int64_t{r / 128} * (p.slots / 4) * 512 + (c / 4) * 512 + (r % 32) * 16 + ((r % 128) / 32) * 4 + c % 4;
  } else {
    return int64_t{r} * p.num_groups + c;
  }
}

template <class Arch, typename T, BlockFormat kFormat, bool kSwizzled, bool kAligned>
__global__ void __launch_bounds__(kMxThreads) block_scaled_quant_kernel(const __grid_constant__ BlockScaledProblem p) {
  using Format = FormatOf<kFormat>;

  // Locate this team's slot
  const int sub = threadIdx.x % Format::kTeam;
  const int32_t unit = static_cast<int32_t>(blockIdx.x) * (kMxThreads / Format::kTeam) +
                       static_cast<int32_t>(threadIdx.x) / Format::kTeam;
  const int32_t r = static_cast<int32_t>(p.row_slots.divide(static_cast<uint32_t>(unit)));
  const int32_t c = unit - r * p.slots;
  const bool in_range = unit < p.units;
  const bool valid = in_range && r < p.m && c < p.num_groups;
  const int64_t b = blockIdx.y;
  const int64_t col = int64_t{c} * Format::kGroup + sub * kElemsPerThread;
  const T* src = static_cast<const T*>(p.x) + b * p.x_batch_stride + r * p.x_row_stride + col;
  uint8_t* dst =
      static_cast<uint8_t*>(p.q) + b * p.q_batch_stride + r * p.q_row_stride + col * Format::kQBytes / kElemsPerThread;

  // Wait for the previous kernel's writes; let the next kernel launch
  asm volatile("griddepcontrol.wait;" ::: "memory");
  asm volatile("griddepcontrol.launch_dependents;");

  // Load
  Slice<T> slice;
  if (valid) {
    load_slice<T, kAligned>(src, slice);
  } else {
#pragma unroll
    for (int i = 0; i < Slice<T>::kWords; ++i) slice.w[i] = 0u;
  }

  // Reduce amax, scale byte, quantize
  uint32_t q[Format::kQBytes / 4], scale_byte;
  if constexpr (Format::kFp4) {
    const Fp4Slice out = quantize_slice_nvfp4<T>(slice, __ldg(p.global_scale + b * p.global_scale_stride));
#pragma unroll
    for (int i = 0; i < Format::kQBytes / 4; ++i) q[i] = out.q[i];
    scale_byte = out.s;
  } else {
    const QuantizedSlice<true> out = quantize_slice_e8m0 < T, Format::kTeam,
                               kFormat == BlockFormat::kMxfp8Floor > (slice);
#pragma unroll
    for (int i = 0; i < Format::kQBytes / 4; ++i) q[i] = out.q[i];
    scale_byte = out.e;
  }

  // Store q
  if (valid) {
    if constexpr (kAligned) {
      Vec<Format::kQBytes> v;
#pragma unroll
      for (int i = 0; i < Format::kQBytes / 4; ++i) v.w[i] = q[i];
      v.store(dst);
    } else {
#pragma unroll
      for (int i = 0; i < Format::kQBytes; ++i) dst[i] = static_cast<uint8_t>(q[i / 4] >> (8 * (i % 4)));
    }
  }

  // Store the scale byte (0 in the padding slots)
  if (in_range && sub == 0) {
    p.scale[b * p.scale_batch_stride + mx_scale_offset<kSwizzled>(p, r, c)] =
        valid ? static_cast<uint8_t>(scale_byte) : 0;
  }
}

// Launch the kernel of one instantiation on `stream`.
template <class Arch, typename T, BlockFormat kFormat, bool kSwizzled, bool kAligned>
fp8quant_status_t launch_block_scaled_quant_as(const BlockScaledProblem& problem, cudaStream_t stream) {
  constexpr auto kernel = block_scaled_quant_kernel<Arch, T, kFormat, kSwizzled, kAligned>;
  constexpr int kTeams = kMxThreads / FormatOf<kFormat>::kTeam;
  const dim3 grid((problem.units + kTeams - 1) / kTeams, problem.batch);
  return cuda_error(launch_with_pdl(kernel, grid, dim3(kMxThreads), stream, problem, problem.pdl), "kernel launch");
}

// Launch the kernel for `problem` on `stream` (the C API has checked every value).
template <class Arch>
fp8quant_status_t launch_block_scaled_quant(const BlockScaledProblem& problem, cudaStream_t stream) {
  return FP8QUANT_DISPATCH_DTYPE(problem.dtype, T, [&] {
    return FP8QUANT_DISPATCH_BLOCK_FORMAT(problem.format, kFormat, [&] {
      return FP8QUANT_DISPATCH_BOOL(problem.layout == FP8QUANT_MX_SCALE_SWIZZLED, kSwizzled, [&] {
        return FP8QUANT_DISPATCH_BOOL(problem.aligned, kAligned, [&] {
          return launch_block_scaled_quant_as<Arch, T, kFormat, kSwizzled, kAligned>(problem, stream);
        });
      });
    });
  });
}

}  // namespace fp8quant::kernels
