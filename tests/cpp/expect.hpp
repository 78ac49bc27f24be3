// The C++ tests' one assertion: EXPECT(cond) reports the failed condition with its place and
// counts it in `failures`; main() returns nonzero when any failed.
#pragma once

#include <cstdio>

inline int failures = 0;

#define EXPECT(cond)                                                                  \
  do {                                                                                \
    if (!(cond)) {                                                                    \
      std::fprintf(stderr, "%s:%d: EXPECT(%s) failed\n", __FILE__, __LINE__, #cond); \
      ++failures;                                                                     \
    }                                                                                 \
  } while (0)
