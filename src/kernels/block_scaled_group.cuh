// One team's group in a block-scaled format (docs/contract.md, "MXFP8" and "NVFP4"), shared by
// every kernel that writes Blackwell's formats (block_scaled_quant.cuh, rms_norm.cuh): the
// format's sizes, the group's q bytes and scale byte from the group quantizer's slice cores
// (group_slice.cuh), and where the scale byte goes in each scale layout.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

#include "common/scale_order.hpp"
#include "common/vec.cuh"
#include "kernels/block_scaled_quant.hpp"
#include "kernels/group_slice.cuh"

namespace fp8quant::kernels {

// A team of kGroup / 16 consecutive threads holds one group, 16 elements a thread.
template <BlockFormat kFormat>
struct FormatOf {
  static constexpr bool kFp4 = kFormat == BlockFormat::kNvfp4;
  static constexpr int kGroup = kFp4 ? kNvfp4Group : kMxGroup;
  static constexpr int kTeam = kGroup / kElemsPerThread;
  static constexpr int kQBytes = kFp4 ? kElemsPerThread / 2 : kElemsPerThread;  // q bytes a thread
};

// Byte offset of scale (r, c) in one matrix's buffer of `slots` scale columns (the groups per
// row, rounded up to 4 when swizzled). r and c are never negative: unsigned, their divisions are
// shifts and masks.
template <bool kSwizzled>
__device__ __forceinline__ int64_t mx_scale_offset(int32_t slots, int32_t r, int32_t c) {
  const uint32_t ur = static_cast<uint32_t>(r), uc = static_cast<uint32_t>(c), us = static_cast<uint32_t>(slots);
  if constexpr (kSwizzled) {
    return int64_t{ur / 128} * (us / 4) * 512 + ((uc / 4) * 512 + (ur % 32) * 16 + (ur % 128) / 32 * 4 + uc % 4);
  } else {
    return int64_t{ur} * us + uc;
  }
}

// A thread's part of a quantized group: its q bytes (four to a word, low byte first) and the
// group's scale byte.
template <BlockFormat kFormat>
struct BlockGroup {
  uint32_t q[FormatOf<kFormat>::kQBytes / 4];
  uint32_t scale;
};

// Quantize the slice of each lane, a team holding one group; NVFP4 reads the encode scale
// `global_scale`. MXFP8: every lane of the warp calls it (its teams reduce across lanes); NVFP4:
// any lane alone.
template <typename T, BlockFormat kFormat>
__device__ __forceinline__ BlockGroup<kFormat> quantize_block_group(const Slice<T>& slice, float global_scale) {
  using Format = FormatOf<kFormat>;
  BlockGroup<kFormat> out;
  if constexpr (Format::kFp4) {
    const Fp4Slice fp4 = quantize_slice_nvfp4<T>(slice, global_scale);
#pragma unroll
    for (int i = 0; i < Format::kQBytes / 4; ++i) out.q[i] = fp4.q[i];
    out.scale = fp4.s;
  } else {
    constexpr bool kFloor = kFormat == BlockFormat::kMxfp8Floor;
    const QuantizedSlice<true> mx = quantize_slice_e8m0<T, Format::kTeam, kFloor>(slice);
#pragma unroll
    for (int i = 0; i < Format::kQBytes / 4; ++i) out.q[i] = mx.q[i];
    out.scale = mx.e;
  }
  return out;
}

// Store a thread's q bytes at dst: one vector store when aligned, else byte by byte.
template <BlockFormat kFormat, bool kAligned>
__device__ __forceinline__ void store_block_q(uint8_t* dst, const BlockGroup<kFormat>& group) {
  constexpr int kBytes = FormatOf<kFormat>::kQBytes;
  if constexpr (kAligned) {
    Vec<kBytes> v;
#pragma unroll
    for (int i = 0; i < kBytes / 4; ++i) v.w[i] = group.q[i];
    v.store(dst);
  } else {
#pragma unroll
    for (int i = 0; i < kBytes; ++i) dst[i] = static_cast<uint8_t>(group.q[i / 4] >> (8 * (i % 4)));
  }
}

}  // namespace fp8quant::kernels
