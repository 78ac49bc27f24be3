// The group-quantize core every FP8 quantizer is built from (SPEC 1): a group's finite amax when
// it holds an infinity, its scale (fp32 or UE8M0) from the amax, and its elements to e4m3 bytes
// through the scale's exact division. The kernels bring the reduction across their threads
// (common/reduce.cuh) and put the scales where their layout wants them.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

#include "common/math.cuh"

namespace fp8quant {

// A group's scale s and, with UE8M0 scales, its byte e (s = 2^(e - 127)).
template <bool kUE8M0>
struct GroupScale {
  float s;
  uint32_t e;
};

// The scale of a group whose amax (at least the quantizer's eps) is `amax`: RN(amax / 448),
// rounded up to a power of two for UE8M0 (SPEC 1, step 3).
template <bool kUE8M0>
__device__ __forceinline__ GroupScale<kUE8M0> group_scale(float amax) {
  GroupScale<kUE8M0> g{math::scale_from_amax(amax), 0u};
  if constexpr (kUE8M0) {
    g.e = math::ue8m0_exponent(g.s);
    g.s = math::ue8m0_to_float(g.e);
  }
  return g;
}

// max(acc, |v[i]|) over the finite elements of v: the amax of a group that holds an infinity.
template <int kN>
__device__ __forceinline__ float finite_abs_max(const float (&v)[kN], float acc = 0.0f) {
#pragma unroll
  for (int i = 0; i < kN; ++i) {
    const float a = fabsf(v[i]);
    acc = fmaxf(acc, a < INFINITY ? a : 0.0f);
  }
  return acc;
}

// MXFP8's E8M0 scale byte of a group whose finite amax is `amax` (docs/contract.md, "MXFP8").
// RCEIL: the smallest power of two at or above d = RN(amax / 448), capped at 254 (a subnormal d
// is byte 0 up to 2^-127 and 1 above; d = 0 is byte 0).
// In hardware where the target has it (cvt.rp.satfinite.ue8m0x2).
__device__ __forceinline__ uint32_t e8m0_rceil(float amax) {
#if FP8QUANT_HW_BLOCK_SCALED_CVT
  uint16_t pair;
  asm("cvt.rp.satfinite.ue8m0x2.f32 %0, %1, %2;" : "=h"(pair) : "f"(0.0f), "f"(math::scale_from_amax(amax)));
  return pair & 0xFFu;
#else
  const uint32_t bits = __float_as_uint(math::scale_from_amax(amax));
  const uint32_t exponent = bits >> 23;
  if (exponent == 0u) return bits > math::kUE8M0SubnormalBits ? 1u : 0u;
  return min(exponent + ((bits & 0x7FFFFFu) != 0u), 254u);
#endif
}

// FLOOR (the OCP MX specification's): exponent(amax) - exponent(448), clamped to [0, 254].
__device__ __forceinline__ uint32_t e8m0_floor(float amax) {
  const int exponent = static_cast<int>(__float_as_uint(amax) >> 23);
  return static_cast<uint32_t>(min(max(exponent - 8, 0), 254));
}

// Four elements divided by the group's scale (math::with_divide's `divide`) to four e4m3 bytes,
// low element first.
template <typename Divide>
__device__ __forceinline__ uint32_t quantize4(Divide&& divide, const float* v) {
  const uint32_t lo = math::cvt_e4m3x2(divide(v[0]), divide(v[1]));
  const uint32_t hi = math::cvt_e4m3x2(divide(v[2]), divide(v[3]));
  return lo | (hi << 16);
}

}  // namespace fp8quant
