// Turn run-time values into compile-time constants, one macro per kind of value. The body is
// the last argument, a lambda body that sees the constant under the given name and returns an
// fp8quant_status_t:
//
//   return FP8QUANT_DISPATCH_GROUP_SIZE(p.group_size, kGroupSize, [&] { return launch<kGroupSize>(p); });
//
// A value a macro does not list never reaches the body: the macro returns
// FP8QUANT_ERROR_INVALID_ARGUMENT naming the argument, so a case missing from a new family's
// dispatch fails loudly instead of running another instantiation on the wrong memory. The C API
// validates every value first; these defaults are the second line.
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <cstdint>

#include "common/scale_order.hpp"
#include "fp8quant/common.h"
#include "fp8quant/quant.h"

namespace fp8quant {

// Record "<arg>: no kernel is compiled for value <value>" and return INVALID_ARGUMENT.
fp8quant_status_t no_kernel_for(const char* arg, int64_t value);

}  // namespace fp8quant

#define FP8QUANT_DISPATCH_CASE_(value, ...) \
  case value: {                             \
    __VA_ARGS__                             \
  }

#define FP8QUANT_DISPATCH_DEFAULT_(arg, value) \
  default:                                     \
    return ::fp8quant::no_kernel_for(arg, static_cast<int64_t>(value));

// x_dtype -> T (float, __half or __nv_bfloat16)
#define FP8QUANT_DISPATCH_DTYPE(dtype, T, ...)                                                         \
  [&]() -> fp8quant_status_t {                                                                         \
    switch (dtype) {                                                                                   \
      FP8QUANT_DISPATCH_CASE_(FP8QUANT_DTYPE_BFLOAT16, using T = __nv_bfloat16; return __VA_ARGS__();) \
      FP8QUANT_DISPATCH_CASE_(FP8QUANT_DTYPE_FLOAT16, using T = __half; return __VA_ARGS__();)         \
      FP8QUANT_DISPATCH_CASE_(FP8QUANT_DTYPE_FLOAT32, using T = float; return __VA_ARGS__();)          \
      FP8QUANT_DISPATCH_DEFAULT_("x_dtype", dtype)                                                     \
    }                                                                                                  \
  }()

// group_size -> kGroupSize (32, 64 or 128)
#define FP8QUANT_DISPATCH_GROUP_SIZE(group_size, kGroupSize, ...)                         \
  [&]() -> fp8quant_status_t {                                                            \
    switch (group_size) {                                                                 \
      FP8QUANT_DISPATCH_CASE_(32, constexpr int kGroupSize = 32; return __VA_ARGS__();)   \
      FP8QUANT_DISPATCH_CASE_(64, constexpr int kGroupSize = 64; return __VA_ARGS__();)   \
      FP8QUANT_DISPATCH_CASE_(128, constexpr int kGroupSize = 128; return __VA_ARGS__();) \
      FP8QUANT_DISPATCH_DEFAULT_("group_size", group_size)                                \
    }                                                                                     \
  }()

// scale_layout -> kOrder (its ScaleOrder: mn and mn_tma give the same one)
#define FP8QUANT_DISPATCH_SCALE_ORDER(layout, kOrder, ...)                                                            \
  [&]() -> fp8quant_status_t {                                                                                        \
    switch (layout) {                                                                                                 \
      FP8QUANT_DISPATCH_CASE_(FP8QUANT_SCALE_ROW, constexpr auto kOrder = ::fp8quant::ScaleOrder::kRow;               \
                              return __VA_ARGS__();)                                                                  \
      case FP8QUANT_SCALE_MN:                                                                                         \
        FP8QUANT_DISPATCH_CASE_(FP8QUANT_SCALE_MN_TMA, constexpr auto kOrder = ::fp8quant::ScaleOrder::kColumn;       \
                                return __VA_ARGS__();)                                                                \
        FP8QUANT_DISPATCH_CASE_(FP8QUANT_SCALE_PACKED_UE8M0, constexpr auto kOrder = ::fp8quant::ScaleOrder::kPacked; \
                                return __VA_ARGS__();)                                                                \
        FP8QUANT_DISPATCH_DEFAULT_("scale_layout", layout)                                                            \
    }                                                                                                                 \
  }()

#define FP8QUANT_DISPATCH_BOOL(value, kValue, ...) \
  [&]() -> fp8quant_status_t {                     \
    if (value) {                                   \
      constexpr bool kValue = true;                \
      return __VA_ARGS__();                        \
    }                                              \
    constexpr bool kValue = false;                 \
    return __VA_ARGS__();                          \
  }()

// ScaleTransformProblem::op -> kOp
#define FP8QUANT_DISPATCH_SCALE_TRANSFORM(op, kOp, ...)                                  \
  [&]() -> fp8quant_status_t {                                                           \
    switch (op) {                                                                        \
      FP8QUANT_DISPATCH_CASE_(::fp8quant::ScaleTransform::kConvert,                      \
                              constexpr auto kOp = ::fp8quant::ScaleTransform::kConvert; \
                              return __VA_ARGS__();)                                     \
      FP8QUANT_DISPATCH_CASE_(::fp8quant::ScaleTransform::kPack,                         \
                              constexpr auto kOp = ::fp8quant::ScaleTransform::kPack;    \
                              return __VA_ARGS__();)                                     \
      FP8QUANT_DISPATCH_CASE_(::fp8quant::ScaleTransform::kUnpack,                       \
                              constexpr auto kOp = ::fp8quant::ScaleTransform::kUnpack;  \
                              return __VA_ARGS__();)                                     \
      FP8QUANT_DISPATCH_DEFAULT_("op", op)                                               \
    }                                                                                    \
  }()

// QuantProblem::source -> kSource
#define FP8QUANT_DISPATCH_QUANT_SOURCE(source, kSource, ...)                                                           \
  [&]() -> fp8quant_status_t {                                                                                         \
    switch (source) {                                                                                                  \
      FP8QUANT_DISPATCH_CASE_(::fp8quant::QuantSource::kRows, constexpr auto kSource = ::fp8quant::QuantSource::kRows; \
                              return __VA_ARGS__();)                                                                   \
      FP8QUANT_DISPATCH_CASE_(::fp8quant::QuantSource::kSiluMul,                                                       \
                              constexpr auto kSource = ::fp8quant::QuantSource::kSiluMul;                              \
                              return __VA_ARGS__();)                                                                   \
      FP8QUANT_DISPATCH_CASE_(::fp8quant::QuantSource::kScatter,                                                       \
                              constexpr auto kSource = ::fp8quant::QuantSource::kScatter;                              \
                              return __VA_ARGS__();)                                                                   \
      FP8QUANT_DISPATCH_DEFAULT_("source", source)                                                                     \
    }                                                                                                                  \
  }()
