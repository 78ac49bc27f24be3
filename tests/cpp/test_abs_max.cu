// Checks on the GPU that the 16-bit amax of the block-scaled kernels equals its definition on the
// bit patterns (math::abs_max_if_finite: with the sign cleared, bits order as magnitudes do,
// infinity above every finite value and NaN above infinity): math::abs_max_nan2 (one
// max.NaN.xorsign.abs a word) for every pair of 16-bit patterns, bf16 and fp16, in both halves
// of the word; then abs_max_if_finite over 16 elements (its finite flag, and its amax where
// finite) for 2^28 random slices with NaN, infinities and zeros planted. Skipped (exit code
// kSkipped) without a GPU.
#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <cstdio>

#include "common/math.cuh"
#include "gpu.hpp"

namespace {

// The definition for one 16-bit pair: NaN (any pattern above infinity's, sign cleared) if either
// is NaN, else the larger magnitude's bits.
__device__ bool pair_ok(uint32_t x, uint32_t y, uint32_t got, uint32_t inf) {
  const uint32_t mx = x & 0x7FFFu, my = y & 0x7FFFu;
  const uint32_t g = got & 0x7FFFu;
  return mx > inf || my > inf ? g > inf : g == max(mx, my);
}

template <typename T>
__device__ bool pairs_ok(uint32_t x, uint32_t y, uint32_t inf) {
  const uint32_t d = fp8quant::math::abs_max_nan2<T>(x | y << 16, y | x << 16);
  return pair_ok(x, y, d, inf) && pair_ok(y, x, d >> 16, inf);
}

// The definition for a slice of 8 words: the magnitudes' largest bits, finite below infinity's.
template <typename T>
__device__ bool slice_ok(const uint32_t (&w)[8], uint32_t inf) {
  uint32_t bits = 0;
  for (int i = 0; i < 8; ++i) bits = max(bits, max(w[i] & 0x7FFFu, (w[i] >> 16) & 0x7FFFu));
  bool finite;
  const float amax = fp8quant::math::abs_max_if_finite<T>(w, &finite);
  if (finite != (bits < inf)) return false;
  if (!finite) return true;
  float want;
  if constexpr (std::is_same_v<T, __half>) {
    want = __half2float(__ushort_as_half(static_cast<unsigned short>(bits)));
  } else {
    want = __uint_as_float(bits << 16);
  }
  return __float_as_uint(amax) == __float_as_uint(want);
}

// Counts: run_exhaustive_check's (ExhaustiveTally).
__global__ void compare(unsigned long long* counts) {
  ExhaustiveTally tally;
  const uint64_t stride = uint64_t(gridDim.x) * blockDim.x;
  const uint64_t first = blockIdx.x * uint64_t(blockDim.x) + threadIdx.x;
  for (uint64_t i = first; i <= 0xFFFFFFFFull; i += stride) {
    const uint32_t x = uint32_t(i) & 0xFFFFu, y = uint32_t(i >> 16);
    const bool same = pairs_ok<__nv_bfloat16>(x, y, 0x7F80u) && pairs_ok<__half>(x, y, 0x7C00u);
    tally.record(same, i, counts);
  }
  for (uint64_t i = first; i < (1ull << 28); i += stride) {
    uint32_t w[8];
    for (int k = 0; k < 8; ++k) {
      const uint64_t r = splitmix64(i * 8 + k);
      w[k] = uint32_t(r);
      // Plant the special values in about one word in eight (each half in turn)
      const uint32_t special = uint32_t(r >> 32);
      if ((special & 7u) == 0) {
        const uint32_t values[6] = {0x7F80u, 0x7FC1u, 0x7C00u, 0x7E00u, 0x0000u, 0x8000u};
        const uint32_t v = values[(special >> 3) % 6], shift = (special >> 8) & 16u;
        w[k] = (w[k] & ~(0xFFFFu << shift)) | v << shift;
      } else if ((special & 7u) == 1) {
        w[k] &= 0x807F807Fu;  // subnormals (bf16) and small values
      }
    }
    const bool same = slice_ok<__nv_bfloat16>(w, 0x7F80u) && slice_ok<__half>(w, 0x7C00u);
    tally.record(same, (1ull << 32) + i, counts);
  }
  tally.add_to(counts);
}

}  // namespace

int main() {
  if (!gpu_or_skip()) return kSkipped;
  return run_exhaustive_check("abs_max_nan2 (every 16-bit pair) and abs_max_if_finite (2^28 slices)",
                              0x100000000ull + (1ull << 28),
                              [](unsigned long long* counts) { compare<<<132 * 16, 256>>>(counts); });
}
