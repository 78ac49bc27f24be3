// Error state of the C API: the per-thread message behind each status (common/error.hpp).
#include "common/error.hpp"

#include <cuda_runtime_api.h>

#include <string>

#include "common/dispatch.hpp"

namespace fp8quant {
namespace {
thread_local std::string last_error;
}  // namespace

fp8quant_status_t set_error(fp8quant_status_t status, std::string message) {
  last_error = std::move(message);
  return status;
}

const char* last_error_message() { return last_error.c_str(); }

fp8quant_status_t no_kernel_for(const char* arg, int64_t value) {
  return set_error(FP8QUANT_ERROR_INVALID_ARGUMENT,
                   std::string(arg) + ": no kernel is compiled for value " + std::to_string(value));
}

fp8quant_status_t cuda_error(cudaError_t err, const char* what) {
  if (err == cudaSuccess) return FP8QUANT_SUCCESS;
  return set_error(FP8QUANT_ERROR_CUDA, std::string(what) + " failed: " + cudaGetErrorString(err));
}

}  // namespace fp8quant
