// What the C API tests share: a well-formed call object (a struct with run()) broken one argument
// at a time and checked for its refusal, a call that must pass validation, and main()'s report.
#pragma once

#include <cuda_runtime_api.h>

#include <cstdint>
#include <cstdio>
#include <cstring>
#include <type_traits>

#include "expect.hpp"
#include "fp8quant/common.h"
#include "gpu.hpp"

// The i-th of the fake device addresses a test's call objects point at: i MiB, 256-byte aligned
// and far apart, never dereferenced by a refused call (validation fails, or M == 0 returns,
// before any device access).
template <typename T = void>
T* fake_address(int i) {
  return reinterpret_cast<T*>(uintptr_t(i) << 20);
}

// The bfloat16 bits of f (truncated: the tests' values are exact in bfloat16).
inline uint16_t bf16(float f) {
  uint32_t bits;
  std::memcpy(&bits, &f, 4);
  return static_cast<uint16_t>(bits >> 16);
}

// The fake input, output and scale addresses of the quantizers' calls.
inline const void* const kFakeX = fake_address<const void>(1);
inline void* const kFakeQ = fake_address<void>(2);
inline void* const kFakeScale = fake_address<void>(3);

// The arguments an activation quantizer's C function starts with, for x [batch, m, k] of bf16
// and like-shaped q, on the fake addresses: x, its dtype and geometry, q and its strides, the scale.
struct QuantArgs {
  const void* x = kFakeX;
  void* q = kFakeQ;
  void* scale = kFakeScale;
  fp8quant_dtype_t dtype = FP8QUANT_DTYPE_BFLOAT16;
  int64_t batch = 1, m = 4, k = 256;
  int64_t x_batch_stride = 0, x_row_stride = 256, q_batch_stride = 0, q_row_stride = 256;  // elements of x, bytes of q
};

// Free the device buffers of a launch check.
template <typename... P>
void free_all(P... ptrs) {
  (cudaFree(ptrs), ...);
}

// `call.run()` is refused: INVALID_ARGUMENT, with a message that starts with "<arg>:" and
// contains `text`.
template <typename Call>
void expect_invalid(const Call& call, const char* arg, const char* text = "") {
  expect_invalid_argument(call.run(), arg, text);
}

// A call on fake addresses (a call object's run(), or a callable) passes validation: NO_DEVICE
// without a GPU. With one it is not run: the launches are each test's own, on real buffers.
template <typename Call>
void expect_valid_without_gpu(const Call& call) {
  if (have_gpu()) return;
  if constexpr (std::is_invocable_v<const Call&>) {
    EXPECT(call() == FP8QUANT_ERROR_NO_DEVICE);
  } else {
    EXPECT(call.run() == FP8QUANT_ERROR_NO_DEVICE);
  }
}

// main()'s end: 1 when a check failed; else 0, after a line naming `what` passed and whether the
// launches ran.
inline int finish(const char* what, bool launched) {
  if (failures) {
    std::fprintf(stderr, "%d check(s) failed\n", failures);
    return 1;
  }
  if (launched) {
    std::printf("all %s checks passed\n", what);
  } else {
    std::printf("all %s host checks passed (no supported GPU: the launch checks did not run)\n", what);
  }
  return 0;
}
