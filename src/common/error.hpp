// Error state of the C API: a status plus a per-thread message naming what was wrong.
#pragma once

#include <cuda_runtime_api.h>

#include <string>

#include "fp8quant/common.h"

namespace fp8quant {

// Record `message` as the calling thread's last error and return `status`.
fp8quant_status_t set_error(fp8quant_status_t status, std::string message);

// The calling thread's last error message ("" before any; fp8quant_last_error).
const char* last_error_message();

// SUCCESS for cudaSuccess; otherwise record "<what> failed: <CUDA's message>" and return CUDA.
fp8quant_status_t cuda_error(cudaError_t err, const char* what);

}  // namespace fp8quant

// Return FP8QUANT_ERROR_INVALID_ARGUMENT from the enclosing C API function unless `cond`
// holds; the message starts with the argument's name.
#define FP8QUANT_CHECK_ARG(cond, arg, message)                                                            \
  do {                                                                                                    \
    if (!(cond)) {                                                                                        \
      return ::fp8quant::set_error(FP8QUANT_ERROR_INVALID_ARGUMENT, std::string(arg) + ": " + (message)); \
    }                                                                                                     \
  } while (0)

// Return the status of `expr` from the enclosing function unless it is FP8QUANT_SUCCESS.
#define FP8QUANT_RETURN_IF_ERROR(expr)       \
  do {                                       \
    const fp8quant_status_t st_ = (expr);    \
    if (st_ != FP8QUANT_SUCCESS) return st_; \
  } while (0)
