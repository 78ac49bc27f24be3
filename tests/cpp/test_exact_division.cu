// Checks on the GPU that the kernel's fast division (reciprocal + two FMAs) equals IEEE
// division, bit for bit, over a domain wider than the kernel's: about 4.3e9 random (x, s) pairs
// with s >= kFastDivMinScale, finite x and |x/s| < 2^126 (the kernel's quotients are at most
// 448; near overflow the remainder would be inf - inf). Then every finite float32 amax >= 0
// through scale_from_amax and fp4_scale_from_amax, against IEEE amax / 448 and amax / 6; the
// reciprocal rcp_rn against __frcp_rn for every scale the kernels can form (every float32 from
// kFastDivMinScale to FLT_MAX / 448); and NVFP4's factor S / s (fp4_factor) against IEEE for
// every e4m3 scale s > 0 and every S of the binades [1/4, 1/2), [1, 2) and [2^115, 2^116]. In
// between S's exponent does not change the fast division's result: every value it forms (the
// quotient, the FMA's exact remainder, the correction) scales by the same power of two, with
// none subnormal or overflowing. Skipped (exit code kSkipped) without a GPU.
#include <cfloat>
#include <cstdio>
#include <cstring>

#include "common/math.cuh"
#include "gpu.hpp"

namespace {

// Counts: [0] samples, [1] float32 mismatches where |x/s| >= 2^-11 or x/s is a signed zero,
// [2] e4m3 mismatches.
__global__ void compare(uint64_t samples, unsigned long long* counts) {
  unsigned long long fp32_bad = 0, fp8_bad = 0, n = 0;
  for (uint64_t i = blockIdx.x * uint64_t(blockDim.x) + threadIdx.x; i < samples;
       i += uint64_t(gridDim.x) * blockDim.x) {
    const uint64_t r = splitmix64(i);
    // s: any float32 in [2^-90, 2^126): random exponent and mantissa
    const uint32_t s_exp = 127 - 90 + uint32_t(r % 216);
    const float s = __uint_as_float((s_exp << 23) | uint32_t((r >> 8) & 0x7FFFFF));
    // x: s * u with |u| <= 448 (the kernel's range), any finite float32, or a signed zero or
    // subnormal (whose quotient's sign must survive)
    float x;
    const uint32_t rx = uint32_t(r >> 32);
    switch (r & 3) {
      case 0:
        x = __uint_as_float((rx & 0x80000000u) | ((rx & 0x7FFFFFu) >> (rx & 31)));
        break;
      case 1:
        x = __uint_as_float(rx);
        if (!isfinite(x)) x = 1.0f;
        break;
      default: {
        const float u = __uint_as_float((rx & 0x807FFFFFu) | ((110u + (rx >> 23) % 25u) << 23));
        x = fminf(fmaxf(__fmul_rn(s, u), -3.0e38f), 3.0e38f);
      }
    }
    const float exact = __fdiv_rn(x, s);
    if (!(fabsf(exact) < 0x1p126f)) continue;  // overflowing quotients: the kernel's are <= 448
    const float fast = fp8quant::math::div_rn_with_rcp(x, s, fp8quant::math::rcp_rn(s));
    fp32_bad += (fabsf(exact) >= 0x1p-11f || exact == 0.0f) && __float_as_uint(exact) != __float_as_uint(fast);
    fp8_bad += fp8quant::math::cvt_e4m3x2(exact, 0.0f) != fp8quant::math::cvt_e4m3x2(fast, 0.0f);
    ++n;
  }
  atomicAdd(&counts[0], n);
  atomicAdd(&counts[1], fp32_bad);
  atomicAdd(&counts[2], fp8_bad);
}

// Counts: [0] amax values, [1] FP8 scale mismatches, [2] NVFP4 block scale mismatches.
__global__ void compare_scales(unsigned long long* counts) {
  constexpr uint32_t kLast = 0x7F7FFFFFu;  // FLT_MAX
  unsigned long long fp8_bad = 0, fp4_bad = 0, n = 0;
  for (uint64_t bits = blockIdx.x * uint64_t(blockDim.x) + threadIdx.x; bits <= kLast;
       bits += uint64_t(gridDim.x) * blockDim.x) {
    const float amax = __uint_as_float(uint32_t(bits));
    fp8_bad += __float_as_uint(fp8quant::math::scale_from_amax(amax)) !=
               __float_as_uint(__fdiv_rn(amax, fp8quant::math::kFp8Max));
    fp4_bad += __float_as_uint(fp8quant::math::fp4_scale_from_amax(amax)) !=
               __float_as_uint(__fdiv_rn(amax, fp8quant::math::kFp4Max));
    ++n;
  }
  atomicAdd(&counts[0], n);
  atomicAdd(&counts[1], fp8_bad);
  atomicAdd(&counts[2], fp4_bad);
}

// Counts: [0] (S, s) pairs, [1] factor mismatches against IEEE S / s. S: every float32 of the
// binade starting at `binade` (a bit pattern) and the next binade's first, each with every e4m3
// s > 0.
__global__ void compare_factors(uint32_t binade, unsigned long long* counts) {
  unsigned long long bad = 0, n = 0;
  for (uint32_t m = blockIdx.x * blockDim.x + threadIdx.x; m <= (1u << 23); m += gridDim.x * blockDim.x) {
    const float scale = __uint_as_float(binade + m);
    for (uint32_t byte = 1; byte < 0x7F; ++byte) {
      const float s = fp8quant::math::e4m3_to_float(byte);
      bad += __float_as_uint(fp8quant::math::fp4_factor(scale, s)) != __float_as_uint(__fdiv_rn(scale, s));
      ++n;
    }
  }
  atomicAdd(&counts[0], n);
  atomicAdd(&counts[1], bad);
}

// Counts: [0] scales, [1] reciprocal mismatches.
__global__ void compare_reciprocals(unsigned long long* counts) {
  const uint32_t first = __float_as_uint(fp8quant::math::kFastDivMinScale);
  const uint32_t last = __float_as_uint(__fdiv_rn(0x1.fffffep127f, fp8quant::math::kFp8Max));  // FLT_MAX / 448
  unsigned long long bad = 0, n = 0;
  for (uint64_t bits = first + blockIdx.x * uint64_t(blockDim.x) + threadIdx.x; bits <= last;
       bits += uint64_t(gridDim.x) * blockDim.x) {
    const float s = __uint_as_float(uint32_t(bits));
    bad += __float_as_uint(fp8quant::math::rcp_rn(s)) != __float_as_uint(__frcp_rn(s));
    ++n;
  }
  atomicAdd(&counts[0], n);
  atomicAdd(&counts[1], bad);
}

// Copy the first n counts back into h; false (and the CUDA error printed) if the kernel failed.
bool read_counts(const unsigned long long* counts, unsigned long long* h, size_t n) {
  if (cudaMemcpy(h, counts, n * sizeof(*counts), cudaMemcpyDeviceToHost) == cudaSuccess) return true;
  std::printf("CUDA error: %s\n", cudaGetErrorString(cudaGetLastError()));
  return false;
}

uint32_t float_bits(float f) {
  uint32_t bits;
  std::memcpy(&bits, &f, sizeof(bits));
  return bits;
}

}  // namespace

int main() {
  if (!gpu_or_skip()) return kSkipped;
  unsigned long long* counts;
  cudaMalloc(&counts, 3 * sizeof(*counts));
  cudaMemset(counts, 0, 3 * sizeof(*counts));
  compare<<<132 * 16, 256>>>(uint64_t{1} << 32, counts);
  unsigned long long h[3];
  if (!read_counts(counts, h, 3)) return 1;
  std::printf("%llu samples: %llu float32 mismatches (|x/s| >= 2^-11 or 0), %llu e4m3 mismatches\n", h[0], h[1], h[2]);
  const bool divisions_ok = h[1] == 0 && h[2] == 0 && h[0] > (uint64_t{3} << 30);

  cudaMemset(counts, 0, 3 * sizeof(*counts));
  compare_scales<<<132 * 16, 256>>>(counts);
  if (!read_counts(counts, h, 3)) return 1;
  std::printf(
      "%llu amax values (every finite float32 >= 0): %llu scale mismatches against amax / 448, %llu against "
      "amax / 6\n",
      h[0], h[1], h[2]);
  const bool scales_ok = h[1] == 0 && h[2] == 0 && h[0] == 0x7F800000ull;

  // S's binades: the least, one inside, and the last (up to kFastFactorMaxScale = 2^116 itself)
  bool factors_ok = true;
  for (const float first : {fp8quant::math::kFastFactorMinScale, 1.0f, 0x1p115f}) {
    cudaMemset(counts, 0, 2 * sizeof(*counts));
    compare_factors<<<132 * 16, 256>>>(float_bits(first), counts);
    if (!read_counts(counts, h, 2)) return 1;
    std::printf("%llu (S, s) pairs, S in [%g, %g]: %llu factor mismatches against S / s\n", h[0], double(first),
                2.0 * double(first), h[1]);
    factors_ok = factors_ok && h[1] == 0 && h[0] == 126ull * ((1ull << 23) + 1);
  }

  cudaMemset(counts, 0, 2 * sizeof(*counts));
  compare_reciprocals<<<132 * 16, 256>>>(counts);
  if (!read_counts(counts, h, 2)) return 1;
  std::printf(
      "%llu scales (every float32 from 2^-90 to FLT_MAX / 448): %llu reciprocal mismatches against "
      "__frcp_rn\n",
      h[0], h[1]);
  // Every float32 of the range was compared: their bit patterns are consecutive
  const unsigned long long scales =
      float_bits(FLT_MAX / fp8quant::math::kFp8Max) - float_bits(fp8quant::math::kFastDivMinScale) + 1ull;
  const bool reciprocals_ok = h[1] == 0 && h[0] == scales;
  return divisions_ok && scales_ok && reciprocals_ok && factors_ok ? 0 : 1;
}
