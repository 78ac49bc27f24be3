// Checks on the GPU that the kernels' SiLU-and-mul on pairs of 16-bit elements (math::silu_mul2, a
// fast path with an exact fallback) equals PyTorch's evaluation (math::silu_mul: accurate expf,
// IEEE division, each step rounded to T), bit for bit, for every gate word: all 2^32 pairs of bf16
// or fp16 gate values, each with up = (1, 1), which exposes silu itself, and with a random up pair;
// and the same through both forms of the kernels' slice of eight pairs (kernels::silu_mul_slice:
// pair by pair, and fix-ups last), the gate word at each position of a slice in turn, among pairs
// that take the fast path, the exact one (0 to 7 of them, so that the fix-ups-last form fixes up to
// 15 elements a lane) or the out-of-range one. Also that the packed product math::mul2 is the
// float32 product rounded to T for all 2^32 pairs of values. A NaN may differ in payload only (the
// quantizers read every NaN alike). Skipped (exit code kSkipped) without a GPU.
#include <cstdio>
#include <type_traits>

#include "common/math.cuh"
#include "gpu.hpp"
#include "kernels/group_slice.cuh"

namespace {

// The two elements of silu_mul<T>, packed.
template <typename T>
__device__ uint32_t expected(uint32_t gate, uint32_t up) {
  const float2 g = fp8quant::math::unpack2(gate, T{}), u = fp8quant::math::unpack2(up, T{});
  return fp8quant::math::pack2(fp8quant::math::silu_mul<T>(g.x, u.x), fp8quant::math::silu_mul<T>(g.y, u.y), T{});
}

// The 16-bit element holds a NaN.
__device__ bool is_nan(uint32_t h, __nv_bfloat16) { return (h & 0x7FFFu) > 0x7F80u; }
__device__ bool is_nan(uint32_t h, __half) { return (h & 0x7FFFu) > 0x7C00u; }

// Both elements of the words equal, bit for bit or as NaNs.
template <typename T>
__device__ bool same(uint32_t a, uint32_t b) {
  bool equal = true;
  for (int i = 0; i < 2; ++i) {
    const uint32_t x = (a >> (16 * i)) & 0xFFFFu, y = (b >> (16 * i)) & 0xFFFFu;
    equal &= x == y || (is_nan(x, T{}) && is_nan(y, T{}));
  }
  return equal;
}

// A pair both of whose elements the fast path leaves to the exact path: silu(g) within 0.4-3.4
// float32 ulps of a rounding boundary of T (found in float64; tie_is_left checks it on the GPU).
template <typename T>
__device__ uint32_t tie_pair() {
  return std::is_same_v<T, __half> ? fp8quant::math::pack2(-2.724609375f, -4.921875f, T{})
                                   : fp8quant::math::pack2(5.9375f, -3.046875f, T{});
}

template <typename T>
__global__ void tie_is_left(int* left) {
  const fp8quant::math::SiluFast f = fp8quant::math::silu_fast2(fp8quant::math::unpack2(tie_pair<T>(), T{}));
  const uint32_t lo = fp8quant::math::pack2(f.a - f.da, f.b - f.db, T{});
  const uint32_t hi = fp8quant::math::pack2(f.a + f.da, f.b + f.db, T{});
  *left = (lo & 0xFFFFu) != (hi & 0xFFFFu) && (lo >> 16) != (hi >> 16);
}

// silu_mul_slice, in the form kFixupsLast names, of a slice holding `gate` (times `up`) at position w % 8;
// elsewhere, as two bits of a hash of w pick, a pair the fast path keeps, a pair it leaves to the
// exact path (each silu within a few float32 ulps of a rounding boundary of T), or a pair out of
// the fast path's range (|g| > 64), so that 0 to 7 other pairs of a slice take each of the last two,
// the tested one at any rank among them. Every word of the result must match.
template <typename T, bool kFixupsLast>
__device__ bool slice_matches(uint64_t w, uint32_t gate, uint32_t up) {
  using fp8quant::kernels::Slice;
  using fp8quant::math::pack2;
  static_assert(Slice<T>::kWords == 8, "eight pairs a slice");
  const uint32_t near = pack2(0.75f, -3.5f, T{}), far = pack2(-70.0f, 100.0f, T{});
  const uint32_t tie = tie_pair<T>();
  const uint32_t one = pack2(1.0f, 1.0f, T{}), pick = uint32_t(splitmix64(w ^ 0x5111u));
  Slice<T> g, u;
  uint32_t want[8];
  for (int i = 0; i < 8; ++i) {
    const uint32_t kind = (pick >> (2 * i)) & 3u;
    g.w[i] = i == int(w % 8) ? gate : kind == 0 ? far : kind == 1 ? tie : near;
    u.w[i] = i == int(w % 8) ? up : one;
    want[i] = expected<T>(g.w[i], u.w[i]);
  }
  fp8quant::kernels::silu_mul_slice<T, kFixupsLast>(g, u);
  bool ok = true;
  for (int i = 0; i < 8; ++i) ok &= same<T>(g.w[i], want[i]);
  return ok;
}

// Counts: [0] gate words, [1] mismatches with up = (1, 1), [2] mismatches with a random up
// (silu_mul2 or the slice), [3] mul2 mismatches (word w times its own halves swapped: every pair
// of values once per element).
template <typename T>
__global__ void compare(unsigned long long* counts) {
  const uint32_t one = fp8quant::math::pack2(1.0f, 1.0f, T{});
  unsigned long long n = 0, bad_one = 0, bad_random = 0, bad_mul = 0;
  for (uint64_t w = blockIdx.x * uint64_t(blockDim.x) + threadIdx.x; w <= 0xFFFFFFFFull;
       w += uint64_t(gridDim.x) * blockDim.x) {
    const uint32_t gate = uint32_t(w), up = uint32_t(splitmix64(w));
    bad_one += !same<T>(fp8quant::math::silu_mul2<T>(gate, one), expected<T>(gate, one)) ||
               !slice_matches<T, false>(w, gate, one) || !slice_matches<T, true>(w, gate, one);
    bad_random += !same<T>(fp8quant::math::silu_mul2<T>(gate, up), expected<T>(gate, up)) ||
                  !slice_matches<T, false>(w >> 3, gate, up) || !slice_matches<T, true>(w >> 3, gate, up);
    const uint32_t swapped = (gate >> 16) | (gate << 16);
    const float2 a = fp8quant::math::unpack2(gate, T{}), b = fp8quant::math::unpack2(swapped, T{});
    bad_mul += !same<T>(fp8quant::math::mul2(gate, swapped, T{}),
                        fp8quant::math::pack2(__fmul_rn(a.x, b.x), __fmul_rn(a.y, b.y), T{}));
    ++n;
  }
  atomicAdd(&counts[0], n);
  atomicAdd(&counts[1], bad_one);
  atomicAdd(&counts[2], bad_random);
  atomicAdd(&counts[3], bad_mul);
}

template <typename T>
bool check(const char* name, unsigned long long* counts) {
  cudaMemset(counts, 0, 4 * sizeof(*counts));
  compare<T><<<132 * 16, 256>>>(counts);
  unsigned long long h[4];
  int* left = reinterpret_cast<int*>(counts + 4);
  tie_is_left<T><<<1, 1>>>(left);
  int tie_left = 0;
  cudaMemcpy(&tie_left, left, sizeof(tie_left), cudaMemcpyDeviceToHost);
  if (cudaMemcpy(h, counts, sizeof(h), cudaMemcpyDeviceToHost) != cudaSuccess) {
    std::printf("CUDA error: %s\n", cudaGetErrorString(cudaGetLastError()));
    return false;
  }
  std::printf(
      "%s: %llu gate words: %llu silu_mul2 or slice mismatches with up = 1, %llu with a random up; "
      "%llu mul2 mismatches\n",
      name, h[0], h[1], h[2], h[3]);
  if (!tie_left) std::printf("%s: the test's tie pair is not left to the exact path\n", name);
  return tie_left && h[0] == 0x100000000ull && h[1] == 0 && h[2] == 0 && h[3] == 0;
}

}  // namespace

int main() {
  if (!gpu_or_skip()) return kSkipped;
  unsigned long long* counts;
  cudaMalloc(&counts, 5 * sizeof(*counts));
  const bool bf16_ok = check<__nv_bfloat16>("bf16", counts);
  const bool fp16_ok = check<__half>("fp16", counts);
  return bf16_ok && fp16_ok ? 0 : 1;
}
