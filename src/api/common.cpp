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

fp8quant_status_t current_kernel_arch(int* arch, int* major, int* minor) {
  int device_major = 0, device_minor = 0;
  if (const fp8quant_status_t st = current_device_arch(&device_major, &device_minor); st != FP8QUANT_SUCCESS) {
    return st;
  }
  if (major != nullptr) *major = device_major;
  if (minor != nullptr) *minor = device_minor;
  // sm_90a and sm_100a code runs on exactly compute capability 9.0 and 10.0
  if (device_minor == 0 && (device_major == 9 || device_major == 10)) {
    *arch = device_major;
    return FP8QUANT_SUCCESS;
  }
  return set_error(FP8QUANT_ERROR_UNSUPPORTED_DEVICE,
                   "fp8quant runs on sm_90a (Hopper, compute capability 9.0) and sm_100a (Blackwell, 10.0); "
                   "the current device has compute capability " +
                       std::to_string(device_major) + "." + std::to_string(device_minor));
}

fp8quant_status_t current_device_sm_count(int* count) {
  int device = 0;
  cudaError_t err = cudaGetDevice(&device);
  if (err == cudaSuccess) err = cudaDeviceGetAttribute(count, cudaDevAttrMultiProcessorCount, device);
  if (err == cudaSuccess) return FP8QUANT_SUCCESS;
  cudaGetLastError();
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

int fp8quant_cuda_version(void) { return CUDART_VERSION; }

fp8quant_status_t fp8quant_check_device(int* major, int* minor) {
  int arch = 0;
  return fp8quant::current_kernel_arch(&arch, major, minor);
}

}  // extern "C"
