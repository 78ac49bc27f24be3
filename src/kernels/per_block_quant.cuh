// Per-block FP8 quantization of weights: one CTA per 128 x 128 block reads the block once into
// registers, reduces its amax across the CTA, and writes q and the block's scale.
//
// Work split: a row of the block is 128 elements, kRowThreads threads of one 16-byte vector
// each; the CTA's 256 threads cover kRowsPerPass rows at a time and kPasses passes cover the
// block, each thread keeping its kPasses vectors (64 elements) in registers between the two
// phases. Elements past n or k (partial edge blocks) load as 0, which never raises an amax, and
// are not stored.
//
// Requantization (w_scale set) reads float8_e4m3fn blocks and dequantizes each element as it is
// unpacked (math::dequantize_bf16 with the block's scale); the rest is the same, with UE8M0 scales.
//
// Programmatic dependent launch: nothing touches global memory before griddepcontrol.wait
// (docs/kernels.md); the next kernel may launch once every CTA has passed it.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

#include "common/dispatch.hpp"
#include "common/error.hpp"
#include "common/launch.cuh"
#include "common/math.cuh"
#include "common/quantize.cuh"
#include "common/reduce.cuh"
#include "common/vec.cuh"
#include "kernels/per_block_quant.hpp"

namespace fp8quant::kernels {

constexpr int kBlockQuantThreads = 256;

template <typename T>
struct BlockTile {
  static constexpr int kVec = 16 / sizeof(T);                            // elements per 16 bytes
  static constexpr int kRowThreads = kWeightBlock / kVec;                // threads per block row
  static constexpr int kRowsPerPass = kBlockQuantThreads / kRowThreads;  // rows per pass
  static constexpr int kPasses = kWeightBlock / kRowsPerPass;            // passes per block
  static constexpr int kWords = kPasses * 4;                             // 32-bit words a thread holds
  static_assert(kBlockQuantThreads % kRowThreads == 0 && kWeightBlock % kRowsPerPass == 0, "tile");
};

// The elements of one 16-byte vector (4 words, low element first) as floats; fp8 elements are
// dequantized with their block's scale `in_scale` (unused otherwise).
template <typename T>
__device__ __forceinline__ void unpack_vector(const uint32_t* words, float (&v)[16 / sizeof(T)], float in_scale) {
#pragma unroll
  for (int i = 0; i < 4; ++i) {
    if constexpr (sizeof(T) == 1) {
      math::unpack_e4m3x4(words[i], &v[4 * i]);
#pragma unroll
      for (int j = 0; j < 4; ++j) v[4 * i + j] = math::dequantize_bf16(v[4 * i + j], in_scale);
    } else if constexpr (sizeof(T) == 4) {
      v[i] = __uint_as_float(words[i]);
    } else {
      const float2 f = math::unpack2(words[i], T{});
      v[2 * i] = f.x;
      v[2 * i + 1] = f.y;
    }
  }
}

template <class Arch, typename T, bool kUE8M0, bool kAligned>
__global__ void __launch_bounds__(kBlockQuantThreads)
    per_block_quant_kernel(const __grid_constant__ BlockQuantProblem p) {
  using Tile = BlockTile<T>;
  __shared__ float warp_max[kBlockQuantThreads / 32];

  // Locate this thread's column and first row
  const int64_t b = blockIdx.z;
  const int32_t col = blockIdx.x * kWeightBlock + (threadIdx.x % Tile::kRowThreads) * Tile::kVec;
  const int32_t row0 = blockIdx.y * kWeightBlock + threadIdx.x / Tile::kRowThreads;
  const T* src = static_cast<const T*>(p.w) + b * p.w_batch_stride + row0 * p.w_row_stride + col;
  uint8_t* dst = static_cast<uint8_t*>(p.q) + b * p.q_batch_stride + row0 * p.q_row_stride + col;
  const int32_t cols_here = min(Tile::kVec, p.k - col);  // <= 0 past the right edge

  // Wait for the previous kernel's writes; let the next kernel launch
  asm volatile("griddepcontrol.wait;" ::: "memory");
  asm volatile("griddepcontrol.launch_dependents;");
  constexpr bool kDequantize = sizeof(T) == 1;
  const int64_t scale_index = b * p.scale_batch_stride + int64_t{blockIdx.y} * p.col_blocks + blockIdx.x;
  float in_scale = 1.0f;
  if constexpr (kDequantize) in_scale = p.w_scale[scale_index];

  // Load
  uint32_t w[Tile::kWords];
#pragma unroll
  for (int pass = 0; pass < Tile::kPasses; ++pass) {
    const bool row_ok = row0 + pass * Tile::kRowsPerPass < p.n;
    const T* s = src + static_cast<int64_t>(pass) * Tile::kRowsPerPass * p.w_row_stride;
    if constexpr (kAligned) {
      const Vec<16> v = row_ok && cols_here > 0 ? Vec<16>::load(s) : Vec<16>{};
#pragma unroll
      for (int i = 0; i < 4; ++i) w[4 * pass + i] = v.w[i];
    } else if constexpr (kDequantize) {
      uint32_t bytes[4] = {0u, 0u, 0u, 0u};
#pragma unroll
      for (int e = 0; e < Tile::kVec; ++e) {
        if (row_ok && e < cols_here) bytes[e / 4] |= uint32_t{reinterpret_cast<const uint8_t*>(s)[e]} << (8 * (e % 4));
      }
#pragma unroll
      for (int i = 0; i < 4; ++i) w[4 * pass + i] = bytes[i];
    } else {
      uint16_t h[Tile::kVec * sizeof(T) / 2];  // the vector's bytes as 16-bit halves
#pragma unroll
      for (int i = 0; i < Tile::kVec * int(sizeof(T)) / 2; ++i) h[i] = 0;
#pragma unroll
      for (int e = 0; e < Tile::kVec; ++e) {
        if (row_ok && e < cols_here) {
          const T value = s[e];
          memcpy(&h[e * sizeof(T) / 2], &value, sizeof(T));
        }
      }
#pragma unroll
      for (int i = 0; i < 4; ++i) w[4 * pass + i] = h[2 * i] | (static_cast<uint32_t>(h[2 * i + 1]) << 16);
    }
  }

  // Reduce amax: NaN is dropped; a block holding ±inf (rare) is reduced again without them
  float amax = 0.0f;
  if constexpr (kDequantize) {
    // |bfloat16(q * s)| grows with |q| (both roundings are monotonic): reduce the magnitude
    // bytes, NaN (0x7F) dropped, and dequantize only the largest
    uint32_t m = 0u;
#pragma unroll
    for (int i = 0; i < Tile::kWords; ++i) {
      const uint32_t magnitude = w[i] & 0x7F7F7F7Fu;
      m = __vmaxu4(m, magnitude & ~__vcmpeq4(magnitude, 0x7F7F7F7Fu));
    }
    m = max(max(m & 0xFFu, (m >> 8) & 0xFFu), max((m >> 16) & 0xFFu, m >> 24));
    float largest[4];
    math::unpack_e4m3x4(m, largest);
    amax = fabsf(math::dequantize_bf16(largest[0], in_scale));
  } else {
    amax = math::abs_max<T>(w);
  }
  const bool has_inf = __syncthreads_or(amax == INFINITY);
  if (has_inf) {
    float finite_amax = 0.0f;
#pragma unroll
    for (int pass = 0; pass < Tile::kPasses; ++pass) {
      float v[Tile::kVec];
      unpack_vector<T>(&w[4 * pass], v, in_scale);
      finite_amax = finite_abs_max(v, finite_amax);
    }
    amax = finite_amax;
  }
  amax = fmaxf(block_reduce<kBlockQuantThreads / 32>(amax, MaxOp{}, warp_max), p.eps);

  // Scale
  const GroupScale<kUE8M0> scale = group_scale<kUE8M0>(amax);

  // Quantize and store q
  const auto quantize = [&](auto&& divide) {
#pragma unroll
    for (int pass = 0; pass < Tile::kPasses; ++pass) {
      float v[Tile::kVec];
      unpack_vector<T>(&w[4 * pass], v, in_scale);
      Vec<Tile::kVec> out;  // kVec e4m3 bytes
#pragma unroll
      for (int i = 0; i < Tile::kVec / 4; ++i) out.w[i] = quantize4(divide, &v[4 * i]);
      const bool row_ok = row0 + pass * Tile::kRowsPerPass < p.n;
      uint8_t* d = dst + static_cast<int64_t>(pass) * Tile::kRowsPerPass * p.q_row_stride;
      if constexpr (kAligned) {
        if (row_ok && cols_here > 0) out.store(d);
      } else {
#pragma unroll
        for (int i = 0; i < Tile::kVec; ++i) {
          if (row_ok && i < cols_here) d[i] = static_cast<uint8_t>(out.w[i / 4] >> (8 * (i % 4)));
        }
      }
    }
  };
  math::with_divide<kUE8M0>(scale.s, scale.e, has_inf, quantize);

  // Store the scale
  if (threadIdx.x == 0) p.scale[scale_index] = scale.s;
}

template <class Arch, typename T, bool kUE8M0, bool kAligned>
fp8quant_status_t launch_per_block_quant_as(const BlockQuantProblem& problem, cudaStream_t stream) {
  const dim3 grid(problem.col_blocks, problem.row_blocks, problem.batch);
  const auto kernel = per_block_quant_kernel<Arch, T, kUE8M0, kAligned>;
  return cuda_error(launch_with_pdl(kernel, grid, dim3(kBlockQuantThreads), stream, problem, problem.pdl),
                    "kernel launch");
}

// Launch the kernel instantiated for `problem` on `stream`.
template <class Arch>
fp8quant_status_t launch_per_block_quant(const BlockQuantProblem& problem, cudaStream_t stream) {
  if (problem.w_scale != nullptr) {  // requantization of an fp8 weight, always to UE8M0 scales
    return FP8QUANT_DISPATCH_BOOL(problem.aligned, kAligned, [&] {
      return launch_per_block_quant_as<Arch, __nv_fp8_e4m3, true, kAligned>(problem, stream);
    });
  }
  return FP8QUANT_DISPATCH_DTYPE(problem.dtype, T, [&] {
    return FP8QUANT_DISPATCH_BOOL(problem.ue8m0, kUE8M0, [&] {
      return FP8QUANT_DISPATCH_BOOL(problem.aligned, kAligned, [&] {
        return launch_per_block_quant_as<Arch, T, kUE8M0, kAligned>(problem, stream);
      });
    });
  });
}

}  // namespace fp8quant::kernels
