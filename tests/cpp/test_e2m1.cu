// Checks on the GPU that the kernels' software e2m1 conversions (sm_90a's paths) equal the
// conversion's definition (docs/contract.md, "NVFP4": the count of the seven rounding boundaries
// |v| passes, ties to the even code, the sign bit of v, NaN to +6): math::e2m1_code (a
// power-of-two scaling and a float add's rounding) for every one of the 2^32 float32 bit
// patterns, and math::e2m1x8_product (three rounded lines and their least, signs from the bit
// patterns) for every one below 7 in magnitude (its domain), in each of the word's eight places.
// Skipped (exit code kSkipped) without a GPU.
#include <cstdio>

#include "common/math.cuh"
#include "gpu.hpp"

namespace {

// The definition: boundaries 0.25 (tie down), 0.75 (up), 1.25 (down), 1.75 (up), 2.5 (down),
// 3.5 (up), 5 (down) between the codes of 0, 0.5, 1, 1.5, 2, 3, 4 and 6.
__device__ uint32_t defined_code(float v) {
  const float a = fabsf(v);
  if (a != a) return 0x7u;
  const uint32_t c = (a > 0.25f) + (a >= 0.75f) + (a > 1.25f) + (a >= 1.75f) + (a > 2.5f) + (a >= 3.5f) + (a > 5.0f);
  return c | ((__float_as_uint(v) >> 28) & 0x8u);
}

// e2m1x8_product's word for v in place w % 8, the other places +0 (code 0).
__device__ uint32_t product_word(float v, uint32_t w) {
  float values[8] = {};
  uint32_t bits[8] = {};
  values[w % 8] = v;
  bits[w % 8] = __float_as_uint(v);
  return fp8quant::math::e2m1x8_product(values, 1.0f, fp8quant::math::e2m1_signs<float>(bits));
}

// Counts: run_exhaustive_check's (ExhaustiveTally), indexed by bit pattern.
__global__ void compare(unsigned long long* counts) {
  ExhaustiveTally tally;
  for (uint64_t w = blockIdx.x * uint64_t(blockDim.x) + threadIdx.x; w <= 0xFFFFFFFFull;
       w += uint64_t(gridDim.x) * blockDim.x) {
    const float v = __uint_as_float(uint32_t(w));
    const uint32_t code = defined_code(v);
    bool same = fp8quant::math::e2m1_code(v) == code;
    if (fabsf(v) < 7.0f) same = same && product_word(v, uint32_t(w)) == code << (4 * (w % 8));
    tally.record(same, w, counts);
  }
  tally.add_to(counts);
}

}  // namespace

int main() {
  if (!gpu_or_skip()) return kSkipped;
  return run_exhaustive_check("e2m1_code and e2m1x8_product (every float32)", 0x100000000ull,
                              [](unsigned long long* counts) { compare<<<132 * 16, 256>>>(counts); });
}
