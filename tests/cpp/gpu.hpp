// What the C++ tests share about the GPU: whether one is present, the exit code ctest reads as
// "skipped" (SKIP_RETURN_CODE in CMakeLists.txt) for the tests that need one, and in CUDA
// sources a counter-based random word generator.
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
#endif
