// Library-wide C API: version, status names, per-thread error messages, device queries.
#include <cuda_runtime_api.h>

#include <string>

#include "common/device.hpp"
#include "common/error.hpp"
#include "fp8quant/common.h"

namespace fp8quant {
namespace {
thread_local std::string last_error;
}  // namespace

fp8quant_status_t set_error(fp8quant_status_t status, std::string message) {
  last_error = std::move(message);
  return status;
}

fp8quant_status_t current_device_arch(int* major, int* minor) {
  int device = 0;
  cudaError_t err = cudaGetDevice(&device);
  if (err == cudaSuccess) err = cudaDeviceGetAttribute(major, cudaDevAttrComputeCapabilityMajor, device);
  if (err == cudaSuccess) err = cudaDeviceGetAttribute(minor, cudaDevAttrComputeCapabilityMinor, device);
  if (err == cudaSuccess) return FP8QUANT_SUCCESS;
  cudaGetLastError();  // leave no sticky non-fatal error behind for the caller
  if (err == cudaErrorNoDevice || err == cudaErrorInsufficientDriver || err == cudaErrorInitializationError) {
    return set_error(FP8QUANT_ERROR_NO_DEVICE,
                     std::string("no CUDA device is available: ") + cudaGetErrorString(err));
  }
  return set_error(FP8QUANT_ERROR_CUDA, std::string("querying the current device failed: ") +
                                            cudaGetErrorString(err));
}

}  // namespace fp8quant

extern "C" {

int fp8quant_version(void) {
  return FP8QUANT_VERSION_MAJOR * 10000 + FP8QUANT_VERSION_MINOR * 100 + FP8QUANT_VERSION_PATCH;
}

const char* fp8quant_status_string(fp8quant_status_t status) {
  switch (status) {
    case FP8QUANT_SUCCESS: return "FP8QUANT_SUCCESS";
    case FP8QUANT_ERROR_INVALID_ARGUMENT: return "FP8QUANT_ERROR_INVALID_ARGUMENT";
    case FP8QUANT_ERROR_NO_DEVICE: return "FP8QUANT_ERROR_NO_DEVICE";
    case FP8QUANT_ERROR_UNSUPPORTED_DEVICE: return "FP8QUANT_ERROR_UNSUPPORTED_DEVICE";
    case FP8QUANT_ERROR_CUDA: return "FP8QUANT_ERROR_CUDA";
  }
  return "FP8QUANT_UNKNOWN_STATUS";
}

const char* fp8quant_last_error(void) { return fp8quant::last_error.c_str(); }

}  // extern "C"
