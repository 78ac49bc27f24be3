// Turn run-time values into compile-time constants, one macro per kind of value. The body is
// the last argument, a lambda body that sees the constant under the given name:
//
//   FP8QUANT_DISPATCH_GROUP_SIZE(p.group_size, kGroupSize, [&] { return launch<kGroupSize>(p); });
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include "fp8quant/common.h"
#include "fp8quant/quant.h"

#define FP8QUANT_DISPATCH_CASE_(value, ...) \
  case value: {                             \
    __VA_ARGS__                             \
  }

#define FP8QUANT_DISPATCH_DTYPE(dtype, T, ...)                                       \
  [&] {                                                                              \
    switch (dtype) {                                                                 \
      FP8QUANT_DISPATCH_CASE_(FP8QUANT_DTYPE_BFLOAT16, using T = __nv_bfloat16;      \
                              return __VA_ARGS__();)                                 \
      FP8QUANT_DISPATCH_CASE_(FP8QUANT_DTYPE_FLOAT16, using T = __half;              \
                              return __VA_ARGS__();)                                 \
      default: {                                                                     \
        using T = float;                                                             \
        return __VA_ARGS__();                                                        \
      }                                                                              \
    }                                                                                \
  }()

#define FP8QUANT_DISPATCH_GROUP_SIZE(group_size, kGroupSize, ...)                    \
  [&] {                                                                              \
    switch (group_size) {                                                            \
      FP8QUANT_DISPATCH_CASE_(32, constexpr int kGroupSize = 32; return __VA_ARGS__();) \
      FP8QUANT_DISPATCH_CASE_(64, constexpr int kGroupSize = 64; return __VA_ARGS__();) \
      default: {                                                                     \
        constexpr int kGroupSize = 128;                                              \
        return __VA_ARGS__();                                                        \
      }                                                                              \
    }                                                                                \
  }()

#define FP8QUANT_DISPATCH_SCALE_LAYOUT(layout, kLayout, ...)                         \
  [&] {                                                                              \
    switch (layout) {                                                                \
      FP8QUANT_DISPATCH_CASE_(FP8QUANT_SCALE_ROW,                                    \
                              constexpr auto kLayout = FP8QUANT_SCALE_ROW;           \
                              return __VA_ARGS__();)                                 \
      FP8QUANT_DISPATCH_CASE_(FP8QUANT_SCALE_MN,                                     \
                              constexpr auto kLayout = FP8QUANT_SCALE_MN;            \
                              return __VA_ARGS__();)                                 \
      FP8QUANT_DISPATCH_CASE_(FP8QUANT_SCALE_MN_TMA,                                 \
                              constexpr auto kLayout = FP8QUANT_SCALE_MN_TMA;        \
                              return __VA_ARGS__();)                                 \
      default: {                                                                     \
        constexpr auto kLayout = FP8QUANT_SCALE_PACKED_UE8M0;                        \
        return __VA_ARGS__();                                                        \
      }                                                                              \
    }                                                                                \
  }()

#define FP8QUANT_DISPATCH_BOOL(value, kValue, ...) \
  [&] {                                            \
    if (value) {                                   \
      constexpr bool kValue = true;                \
      return __VA_ARGS__();                        \
    }                                              \
    constexpr bool kValue = false;                 \
    return __VA_ARGS__();                          \
  }()
