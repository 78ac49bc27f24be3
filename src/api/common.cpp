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

fp8quant_status_t current_device(DeviceInfo* device) {
  int ordinal = 0;
  cudaError_t err = cudaGetDevice(&ordinal);
  if (err == cudaSuccess) err = cudaDeviceGetAttribute(&device->major, cudaDevAttrComputeCapabilityMajor, ordinal);
  if (err == cudaSuccess) err = cudaDeviceGetAttribute(&device->minor, cudaDevAttrComputeCapabilityMinor, ordinal);
  if (err == cudaSuccess) err = cudaDeviceGetAttribute(&device->sm_count, cudaDevAttrMultiProcessorCount, ordinal);
  if (err == cudaSuccess) return FP8QUANT_SUCCESS;
  cudaGetLastError();  // leave no sticky non-fatal error behind for the caller
  if (err == cudaErrorNoDevice || err == cudaErrorInsufficientDriver || err == cudaErrorInitializationError) {
    return set_error(FP8QUANT_ERROR_NO_DEVICE,
                     std::string("no CUDA device is available: ") + cudaGetErrorString(err));
  }
  return set_error(FP8QUANT_ERROR_CUDA, std::string("querying the current device failed: ") +
                                            cudaGetErrorString(err));
}

fp8quant_status_t kernel_arch(const DeviceInfo& device, int* arch) {
  // sm_90a and sm_100a code runs on exactly compute capability 9.0 and 10.0
  if (device.minor == 0 && (device.major == 9 || device.major == 10)) {
    *arch = device.major;
    return FP8QUANT_SUCCESS;
  }
  return set_error(FP8QUANT_ERROR_UNSUPPORTED_DEVICE,
                   "fp8quant runs on sm_90a (Hopper, compute capability 9.0) and sm_100a (Blackwell, 10.0); "
                   "the current device has compute capability " +
                       std::to_string(device.major) + "." + std::to_string(device.minor));
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
  fp8quant::DeviceInfo device{};
  if (const fp8quant_status_t st = fp8quant::current_device(&device); st != FP8QUANT_SUCCESS) return st;
  if (major != nullptr) *major = device.major;
  if (minor != nullptr) *minor = device.minor;
  int arch = 0;
  return fp8quant::kernel_arch(device, &arch);
}

}  // extern "C"
