// What the C API tests share: a well-formed call object (a struct with run()) broken one argument
// at a time and checked for its refusal, a call that must pass validation, and main()'s report.
#pragma once

#include <cstdio>
#include <type_traits>

#include "expect.hpp"
#include "fp8quant/common.h"
#include "gpu.hpp"

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
