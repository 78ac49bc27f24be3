// What the C++ tests share about the GPU: whether one is present, the exit code ctest reads as
// "skipped" (SKIP_RETURN_CODE in CMakeLists.txt) for the tests that need one, and in CUDA
// sources a counter-based random word generator and the exhaustive checks' tally and runner.
#pragma once

#include <cuda_runtime_api.h>

#include <cstdint>
#include <cstdio>

inline constexpr int kSkipped = 77;

inline bool have_gpu() {
  int count = 0;
  return cudaGetDeviceCount(&count) == cudaSuccess && count > 0;
}

// A GPU-only test's start: false, after saying the test is skipped, without a GPU
// (main returns kSkipped then).
inline bool gpu_or_skip() {
  if (have_gpu()) return true;
  std::printf("no GPU: skipped\n");
  return false;
}

#ifdef __CUDACC__
// splitmix64: a well-mixed 64-bit word from a counter, the same on every run.
__device__ inline uint64_t splitmix64(uint64_t z) {
  z += 0x9E3779B97F4A7C15ull;
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
  return z ^ (z >> 31);
}

// A thread's share of an exhaustive check's counts (run_exhaustive_check below): record each
// check where it runs, then add_to the counts once, when the thread is done.
struct ExhaustiveTally {
  unsigned long long checks = 0, mismatches = 0;
  __device__ void record(bool same, unsigned long long index, unsigned long long* counts) {
    if (!same && mismatches++ == 0) atomicMin(&counts[2], index);
    ++checks;
  }
  __device__ void add_to(unsigned long long* counts) const {
    atomicAdd(&counts[0], checks);
    atomicAdd(&counts[1], mismatches);
  }
};

// The exhaustive checks' protocol: `check(counts)` launches a kernel that adds its checks to
// counts[0] and its mismatches to counts[1], and lowers counts[2] to the first mismatching index.
// Runs it, prints "<what>: N checks, M mismatches" (and the first index), and returns main's
// status: 0 when exactly `expected` checks ran and none mismatched.
template <class Check>
int run_exhaustive_check(const char* what, unsigned long long expected, Check check) {
  unsigned long long* counts;
  cudaMalloc(&counts, 3 * sizeof(*counts));
  const unsigned long long init[3] = {0, 0, ~0ull};
  cudaMemcpy(counts, init, sizeof(init), cudaMemcpyHostToDevice);
  check(counts);
  unsigned long long h[3];
  if (cudaMemcpy(h, counts, sizeof(h), cudaMemcpyDeviceToHost) != cudaSuccess) {
    std::printf("CUDA error: %s\n", cudaGetErrorString(cudaGetLastError()));
    return 1;
  }
  cudaFree(counts);
  std::printf("%s: %llu checks, %llu mismatches", what, h[0], h[1]);
  if (h[1] != 0) std::printf(" (first index 0x%llx)", h[2]);
  std::printf("\n");
  return h[0] == expected && h[1] == 0 ? 0 : 1;
}
#endif
