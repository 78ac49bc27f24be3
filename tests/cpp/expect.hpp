// The C++ tests' one assertion: EXPECT(cond) reports the failed condition with its place and
// counts it in `failures`; main() returns nonzero when any failed.
#pragma once

#include <cstdio>
#include <string>

#include "fp8quant/common.h"

inline int failures = 0;

#define EXPECT(cond)                                                                 \
  do {                                                                               \
    if (!(cond)) {                                                                   \
      std::fprintf(stderr, "%s:%d: EXPECT(%s) failed\n", __FILE__, __LINE__, #cond); \
      ++failures;                                                                    \
    }                                                                                \
  } while (0)

// A refused call: INVALID_ARGUMENT, with a message that starts with "<arg>:" and contains `text`.
inline void expect_invalid_argument(fp8quant_status_t st, const char* arg, const char* text = "") {
  const std::string msg = fp8quant_last_error();
  if (st != FP8QUANT_ERROR_INVALID_ARGUMENT || msg.rfind(std::string(arg) + ":", 0) != 0 ||
      msg.find(text) == std::string::npos) {
    std::fprintf(stderr, "expected INVALID_ARGUMENT naming '%s' (with '%s'), got %s: '%s'\n", arg, text,
                 fp8quant_status_string(st), msg.c_str());
    ++failures;
  }
}
