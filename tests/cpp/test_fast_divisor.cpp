// FastDivisor against integer division: every divisor up to 2^12 and a spread of larger ones
// (powers of two and their neighbours, values near 2^31), each over the numerators where an
// error would show first (multiples of d and their neighbours, the top of the range) and a
// pseudo-random sample.
#include <cstdint>
#include <cstdio>
#include <vector>

#include "common/fast_divisor.hpp"

namespace {

constexpr uint32_t kMaxNumerator = (uint32_t{1} << 31) - 1;

uint64_t failures = 0;
uint64_t checks = 0;

void check(const fp8quant::FastDivisor& div, uint32_t d, uint32_t n) {
  ++checks;
  if (div.divide(n) != n / d) {
    if (++failures <= 10) std::printf("FAIL: %u / %u = %u, got %u\n", n, d, n / d, div.divide(n));
  }
}

void check_divisor(uint32_t d, uint64_t& rng) {
  const fp8quant::FastDivisor div(d);
  if (div.divisor() != d) {
    ++failures;
    std::printf("FAIL: divisor() = %u, expected %u\n", div.divisor(), d);
  }
  for (uint32_t n = 0; n < 4096; ++n) check(div, d, n);
  for (uint64_t k = 1; k <= 4 && k * d <= kMaxNumerator; ++k) {
    for (const uint64_t n : {k * d - 1, k * d, k * d + 1}) {
      if (n <= kMaxNumerator) check(div, d, static_cast<uint32_t>(n));
    }
  }
  for (uint32_t delta = 0; delta < 4; ++delta) check(div, d, kMaxNumerator - delta);
  const uint32_t top = kMaxNumerator / d * d;  // the largest multiple of d in range
  for (uint32_t delta = 0; delta < 3 && delta <= top; ++delta) check(div, d, top - delta);
  for (int i = 0; i < 2000; ++i) {
    rng = rng * 6364136223846793005ull + 1442695040888963407ull;
    const uint32_t n = static_cast<uint32_t>(rng >> 33);  // [0, 2^31)
    check(div, d, n);
    const uint32_t multiple = n / d * d;
    check(div, d, multiple);
    if (multiple > 0) check(div, d, multiple - 1);
  }
}

}  // namespace

int main() {
  uint64_t rng = 42;
  std::vector<uint32_t> divisors;
  for (uint32_t d = 1; d <= 4096; ++d) divisors.push_back(d);
  for (int bit = 12; bit < 31; ++bit) {
    const uint32_t p = uint32_t{1} << bit;
    for (uint32_t d : {p - 1, p, p + 1, p + p / 2, p * 2 - 3}) divisors.push_back(d);
  }
  for (uint32_t d : {7168u / 128u * 4u, 2147483647u, 2147483646u, 1073741825u, 46341u, 65537u}) divisors.push_back(d);
  for (const uint32_t d : divisors) check_divisor(d, rng);
  std::printf("fast_divisor: %zu divisors, %llu checks, %llu failures\n", divisors.size(),
              static_cast<unsigned long long>(checks), static_cast<unsigned long long>(failures));
  return failures == 0 ? 0 : 1;
}
