// Division of non-negative 31-bit integers by a run-time constant, as a multiply and a shift
// (Granlund and Montgomery, "Division by invariant integers using multiplication", 1994): the
// divisor's magic numbers are computed once on the host, the kernels divide in three instructions
// instead of the ~20 of a general integer division.
#pragma once

#include <cstdint>

#if defined(__CUDACC__)
#define FP8QUANT_HOST_DEVICE __host__ __device__
#else
#define FP8QUANT_HOST_DEVICE
#endif

namespace fp8quant {

class FastDivisor {
 public:
  FastDivisor() = default;

  // d in [1, 2^31).
  explicit FastDivisor(uint32_t d) : divisor_(d) {
    while ((uint64_t{1} << shift_) < d) ++shift_;  // shift = ceil(log2(d))
    // multiplier = floor(2^32 * (2^shift - d) / d) + 1, which fits in 32 bits
    multiplier_ = static_cast<uint32_t>(((uint64_t{1} << 32) * ((uint64_t{1} << shift_) - d)) / d + 1);
  }

  FP8QUANT_HOST_DEVICE uint32_t divisor() const { return divisor_; }

  // n / d for n in [0, 2^31): floor((n * (2^32 + multiplier)) / 2^(32 + shift)); the sum below
  // cannot wrap since the high product is at most n.
  FP8QUANT_HOST_DEVICE uint32_t divide(uint32_t n) const {
#if defined(__CUDA_ARCH__)
    const uint32_t high = __umulhi(n, multiplier_);
#else
    const uint32_t high = static_cast<uint32_t>((uint64_t{n} * multiplier_) >> 32);
#endif
    return (high + n) >> shift_;
  }

 private:
  uint32_t divisor_ = 1;
  uint32_t multiplier_ = 1;
  uint32_t shift_ = 0;
};

}  // namespace fp8quant
