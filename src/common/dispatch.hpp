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

// One case: `label` runs the body with `name` bound to the compile-time `value`.
#define FP8QUANT_DISPATCH_CASE_(label, name, value, ...) \
  case label: {                                          \
    constexpr auto name = value;                         \
    return __VA_ARGS__();                                \
  }

#define FP8QUANT_DISPATCH_DEFAULT_(arg, value) \
  default:                                     \
    return ::fp8quant::no_kernel_for(arg, static_cast<int64_t>(value));

// x_dtype -> T (float, __half or __nv_bfloat16)
#define FP8QUANT_DISPATCH_DTYPE(dtype, T, ...)       \
  [&]() -> fp8quant_status_t {                       \
    switch (dtype) {                                 \
      case FP8QUANT_DTYPE_BFLOAT16: {                \
        using T = __nv_bfloat16;                     \
        return __VA_ARGS__();                        \
      }                                              \
      case FP8QUANT_DTYPE_FLOAT16: {                 \
        using T = __half;                            \
        return __VA_ARGS__();                        \
      }                                              \
      case FP8QUANT_DTYPE_FLOAT32: {                 \
        using T = float;                             \
        return __VA_ARGS__();                        \
      }                                              \
        FP8QUANT_DISPATCH_DEFAULT_("x_dtype", dtype) \
    }                                                \
  }()

// group_size -> kGroupSize (32, 64 or 128)
#define FP8QUANT_DISPATCH_GROUP_SIZE(group_size, kGroupSize, ...) \
  [&]() -> fp8quant_status_t {                                    \
    switch (group_size) {                                         \
      FP8QUANT_DISPATCH_CASE_(32, kGroupSize, 32, __VA_ARGS__)    \
      FP8QUANT_DISPATCH_CASE_(64, kGroupSize, 64, __VA_ARGS__)    \
      FP8QUANT_DISPATCH_CASE_(128, kGroupSize, 128, __VA_ARGS__)  \
      FP8QUANT_DISPATCH_DEFAULT_("group_size", group_size)        \
    }                                                             \
  }()

// scale_layout -> kOrder (its ScaleOrder: mn and mn_tma give the same one)
#define FP8QUANT_DISPATCH_SCALE_ORDER(layout, kOrder, ...)                                                         \
  [&]() -> fp8quant_status_t {                                                                                     \
    switch (layout) {                                                                                              \
      FP8QUANT_DISPATCH_CASE_(FP8QUANT_SCALE_ROW, kOrder, ::fp8quant::ScaleOrder::kRow, __VA_ARGS__)               \
      case FP8QUANT_SCALE_MN:                                                                                      \
        FP8QUANT_DISPATCH_CASE_(FP8QUANT_SCALE_MN_TMA, kOrder, ::fp8quant::ScaleOrder::kColumn, __VA_ARGS__)       \
        FP8QUANT_DISPATCH_CASE_(FP8QUANT_SCALE_PACKED_UE8M0, kOrder, ::fp8quant::ScaleOrder::kPacked, __VA_ARGS__) \
        FP8QUANT_DISPATCH_DEFAULT_("scale_layout", layout)                                                         \
    }                                                                                                              \
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

// scale_layout and ue8m0 -> kOrder and kUE8M0, for the scale formats that exist: packed scales are
// UE8M0 only (the C API refuses the other pairing; here it is no_kernel_for("ue8m0")).
#define FP8QUANT_DISPATCH_SCALE_FORMAT(layout, ue8m0, kOrder, kUE8M0, ...)  \
  FP8QUANT_DISPATCH_SCALE_ORDER(layout, kOrder, [&] {                       \
    return FP8QUANT_DISPATCH_BOOL(ue8m0, kUE8M0, [&] {                      \
      if constexpr (kOrder == ::fp8quant::ScaleOrder::kPacked && !kUE8M0) { \
        return ::fp8quant::no_kernel_for("ue8m0", 0);                       \
      } else {                                                              \
        return __VA_ARGS__();                                               \
      }                                                                     \
    });                                                                     \
  })

// A scoped enum of three values (Enum::a, Enum::b, Enum::c) -> the constant `name`; `arg` names
// the argument in the refusal of any other value.
#define FP8QUANT_DISPATCH_ENUM3_(value, arg, name, Enum, a, b, c, ...) \
  [&]() -> fp8quant_status_t {                                         \
    switch (value) {                                                   \
      FP8QUANT_DISPATCH_CASE_(Enum::a, name, Enum::a, __VA_ARGS__)     \
      FP8QUANT_DISPATCH_CASE_(Enum::b, name, Enum::b, __VA_ARGS__)     \
      FP8QUANT_DISPATCH_CASE_(Enum::c, name, Enum::c, __VA_ARGS__)     \
      FP8QUANT_DISPATCH_DEFAULT_(arg, static_cast<int>(value))         \
    }                                                                  \
  }()

// ScaleTransformProblem::op -> kOp
#define FP8QUANT_DISPATCH_SCALE_TRANSFORM(op, kOp, ...) \
  FP8QUANT_DISPATCH_ENUM3_(op, "op", kOp, ::fp8quant::ScaleTransform, kConvert, kPack, kUnpack, __VA_ARGS__)

// QuantProblem::source -> kSource
#define FP8QUANT_DISPATCH_QUANT_SOURCE(source, kSource, ...) \
  FP8QUANT_DISPATCH_ENUM3_(source, "source", kSource, ::fp8quant::QuantSource, kRows, kSiluMul, kScatter, __VA_ARGS__)

// BlockScaledProblem::format -> kFormat
#define FP8QUANT_DISPATCH_BLOCK_FORMAT(format, kFormat, ...)                                                     \
  FP8QUANT_DISPATCH_ENUM3_(format, "format", kFormat, ::fp8quant::BlockFormat, kMxfp8Rceil, kMxfp8Floor, kNvfp4, \
                           __VA_ARGS__)
