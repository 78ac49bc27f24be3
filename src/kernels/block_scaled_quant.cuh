// Block-scaled quantization for Blackwell's tensor cores (docs/contract.md, "MXFP8" and "NVFP4"):
// one pass reads x once, writes q once and writes each group's scale byte straight into the
// scale layout (row-major, or swizzled, padding included), from the block-scaled group pieces
// (block_scaled_group.cuh).
//
// Work split: a team of kGroup / 16 consecutive threads owns one group (16 elements per thread:
// one or two 16-byte loads; MXFP8 stores 16 bytes a thread, NVFP4 8); teams walk the (row r, group
// slot c) grid slot by slot, so consecutive teams read consecutive groups of a row. Slots past
// the row's groups and rows past m (the swizzled layout's padding) load nothing and store a zero
// byte.
//
// The SiLU-and-mul source (kSiluMul, MoE) reads silu(gate) * up of x's rows [gate | up], and
// follows the MoE layouts' rows as the FP8 kernel does (moe_rows.cuh): rows without a token get
// zero scale bytes inside a GEMM tile and nothing else.
//
// Programmatic dependent launch: nothing touches global memory before griddepcontrol.wait
// (docs/kernels.md).
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

#include "common/dispatch.hpp"
#include "common/error.hpp"
#include "common/launch.cuh"
#include "kernels/block_scaled_group.cuh"
#include "kernels/block_scaled_quant.hpp"
#include "kernels/group_slice.cuh"
#include "kernels/moe_rows.cuh"

namespace fp8quant::kernels {

constexpr int kMxThreads = 256;

template <class Arch, typename T, BlockFormat kFormat, bool kSwizzled, bool kAligned, QuantSource kSource>
__global__ void __launch_bounds__(kMxThreads) block_scaled_quant_kernel(const __grid_constant__ BlockScaledProblem p) {
  using Format = FormatOf<kFormat>;
  constexpr int kTeams = kMxThreads / Format::kTeam;

  // Locate this team's slot
  const int sub = threadIdx.x % Format::kTeam;
  const int32_t unit = static_cast<int32_t>(blockIdx.x) * kTeams + static_cast<int32_t>(threadIdx.x) / Format::kTeam;
  const int32_t r = static_cast<int32_t>(p.row_slots.divide(static_cast<uint32_t>(unit)));
  const int32_t c = unit - r * p.slots;
  const int64_t b = blockIdx.y;
  const int64_t col = int64_t{c} * Format::kGroup + sub * kElemsPerThread;
  const T* src = static_cast<const T*>(p.x) + b * p.x_batch_stride + r * p.x_row_stride + col;
  uint8_t* dst =
      static_cast<uint8_t*>(p.q) + b * p.q_batch_stride + r * p.q_row_stride + col * Format::kQBytes / kElemsPerThread;
  uint8_t* scale = p.scale + b * p.scale_batch_stride + mx_scale_offset<kSwizzled>(p.slots, r, c);

  // Wait for the previous kernel's writes; let the next kernel launch
  asm volatile("griddepcontrol.wait;" ::: "memory");
  asm volatile("griddepcontrol.launch_dependents;");

  // Map the row: a real group is live; the MoE layouts' rows without a token are not, and store
  // their (zero) scale bytes only inside a tile. A block past every tile leaves at once, and so
  // does a warp of rows without tokens, after storing those bytes
  bool in_tile = unit < p.units;
  bool live = in_tile && r < p.m && c < p.num_groups;
  if constexpr (kSource == QuantSource::kSiluMul) {
    const int32_t block_first_row =
        static_cast<int32_t>(p.row_slots.divide(static_cast<uint32_t>(blockIdx.x * kTeams)));
    if (narrow_to_moe_rows(p, b, block_first_row, r, live, in_tile)) return;
    if (__all_sync(kFullMask, !live)) {
      if (in_tile && sub == 0) *scale = 0;
      return;
    }
  }

  // Load (SiLU-and-mul: gate and up, combined in x's dtype)
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

  // Reduce amax, scale byte, quantize (NVFP4: with the encode scale of the batch, or of the row's
  // expert)
  float global_scale = 0.0f;
  if constexpr (Format::kFp4) {
    const int64_t which = p.global_scale_by_row_expert ? (live ? __ldg(p.row_map + r) : 0) : b;
    global_scale = __ldg(p.global_scale + which * p.global_scale_stride);
  }
  const BlockGroup<kFormat> out = quantize_block_group<T, kFormat>(slice, global_scale);

  // Store q, and the scale byte (0 in the padding slots)
  if (live) store_block_q<kFormat, kAligned>(dst, out);
  if (in_tile && sub == 0) *scale = live ? static_cast<uint8_t>(out.scale) : 0;
}

// Launch the kernel of one instantiation on `stream`.
template <class Arch, typename T, BlockFormat kFormat, bool kSwizzled, bool kAligned, QuantSource kSource>
fp8quant_status_t launch_block_scaled_quant_as(const BlockScaledProblem& problem, cudaStream_t stream) {
  constexpr auto kernel = block_scaled_quant_kernel<Arch, T, kFormat, kSwizzled, kAligned, kSource>;
  constexpr int kTeams = kMxThreads / FormatOf<kFormat>::kTeam;
  const dim3 grid((problem.units + kTeams - 1) / kTeams, problem.batch);
  return cuda_error(launch_with_pdl(kernel, grid, dim3(kMxThreads), stream, problem, problem.pdl), "kernel launch");
}

// Launch the kernel for `problem` on `stream` (the C API has checked every value).
template <class Arch>
fp8quant_status_t launch_block_scaled_quant(const BlockScaledProblem& problem, cudaStream_t stream) {
  return FP8QUANT_DISPATCH_BOOL(problem.source == QuantSource::kSiluMul, kSiluMul, [&] {
    constexpr QuantSource kSource = kSiluMul ? QuantSource::kSiluMul : QuantSource::kRows;
    return FP8QUANT_DISPATCH_DTYPE(problem.dtype, T, [&] {
      return FP8QUANT_DISPATCH_BLOCK_FORMAT(problem.format, kFormat, [&] {
        return FP8QUANT_DISPATCH_BOOL(problem.layout == FP8QUANT_MX_SCALE_SWIZZLED, kSwizzled, [&] {
          return FP8QUANT_DISPATCH_BOOL(problem.aligned, kAligned, [&] {
            return launch_block_scaled_quant_as<Arch, T, kFormat, kSwizzled, kAligned, kSource>(problem, stream);
          });
        });
      });
    });
  });
}

}  // namespace fp8quant::kernels
