// Library-wide C API: version, status names, per-thread error messages, device queries and the
// programmatic-dependent-launch switch.
#include "fp8quant/common.h"

#include <cuda_runtime_api.h>

#include <atomic>
#include <cstdlib>
#include <cstring>
#include <string>

#include "api/device.hpp"
#include "common/error.hpp"

namespace fp8quant {

fp8quant_status_t current_device(DeviceInfo* device) {
  // A device's properties never change: each thread keeps those of the last device it asked for
  thread_local int cached_ordinal = -1;
  thread_local DeviceInfo cached{};
  int ordinal = 0;
  cudaError_t err = cudaGetDevice(&ordinal);
  if (err == cudaSuccess && ordinal == cached_ordinal) {
    *device = cached;
    return FP8QUANT_SUCCESS;
  }
  if (err == cudaSuccess) err = cudaDeviceGetAttribute(&device->major, cudaDevAttrComputeCapabilityMajor, ordinal);
  if (err == cudaSuccess) err = cudaDeviceGetAttribute(&device->minor, cudaDevAttrComputeCapabilityMinor, ordinal);
  if (err == cudaSuccess) err = cudaDeviceGetAttribute(&device->sm_count, cudaDevAttrMultiProcessorCount, ordinal);
  if (err == cudaSuccess) {
    cached = *device;
    cached_ordinal = ordinal;
    return FP8QUANT_SUCCESS;
  }
  cudaGetLastError();  // leave no sticky non-fatal error behind for the caller
  if (err == cudaErrorNoDevice || err == cudaErrorInsufficientDriver || err == cudaErrorInitializationError) {
    return set_error(FP8QUANT_ERROR_NO_DEVICE, std::string("no CUDA device is available: ") + cudaGetErrorString(err));
  }
  return set_error(FP8QUANT_ERROR_CUDA, std::string("querying the current device failed: ") + cudaGetErrorString(err));
}

fp8quant_status_t kernel_arch(const DeviceInfo& device, int* arch) {
  // sm_90a code runs on compute capability 9.0 only; sm_100f code on the whole 10.x family
  if ((device.major == 9 && device.minor == 0) || device.major == 10) {
    *arch = device.major;
    return FP8QUANT_SUCCESS;
  }
  std::string message =
      "fp8quant runs on compute capability 9.0 (Hopper: sm_90a) and 10.x (datacenter Blackwell such as "
      "B200 and B300: sm_100f); the current device has compute capability " +
      std::to_string(device.major) + "." + std::to_string(device.minor);
  if (device.major == 12) message += " (Blackwell GeForce/RTX PRO and DGX Spark parts are not built for)";
  return set_error(FP8QUANT_ERROR_UNSUPPORTED_DEVICE, std::move(message));
}

namespace {
// PDL setting: FP8QUANT_PDL=0 in the environment turns it off from the start.
std::atomic<bool>& pdl_setting() {
  static std::atomic<bool> enabled{[] {
    const char* env = std::getenv("FP8QUANT_PDL");
    return env == nullptr || std::strcmp(env, "0") != 0;
  }()};
  return enabled;
}
}  // namespace

bool pdl_enabled() { return pdl_setting().load(std::memory_order_relaxed); }

bool cooperative_enabled() {
  static const bool enabled = [] {
    const char* env = std::getenv("FP8QUANT_COOPERATIVE");
    return env == nullptr || std::strcmp(env, "0") != 0;
  }();
  return enabled;
}

}  // namespace fp8quant

extern "C" {

int fp8quant_version(void) {
  return FP8QUANT_VERSION_MAJOR * 10000 + FP8QUANT_VERSION_MINOR * 100 + FP8QUANT_VERSION_PATCH;
}

const char* fp8quant_status_string(fp8quant_status_t status) {
  switch (status) {
    case FP8QUANT_SUCCESS:
      return "FP8QUANT_SUCCESS";
    case FP8QUANT_ERROR_INVALID_ARGUMENT:
      return "FP8QUANT_ERROR_INVALID_ARGUMENT";
    case FP8QUANT_ERROR_NO_DEVICE:
      return "FP8QUANT_ERROR_NO_DEVICE";
    case FP8QUANT_ERROR_UNSUPPORTED_DEVICE:
      return "FP8QUANT_ERROR_UNSUPPORTED_DEVICE";
    case FP8QUANT_ERROR_CUDA:
      return "FP8QUANT_ERROR_CUDA";
  }
  return "FP8QUANT_UNKNOWN_STATUS";
}

const char* fp8quant_last_error(void) { return fp8quant::last_error_message(); }

int fp8quant_cuda_version(void) { return CUDART_VERSION; }

int fp8quant_set_pdl(int enabled) {
  return fp8quant::pdl_setting().exchange(enabled != 0, std::memory_order_relaxed) ? 1 : 0;
}

int fp8quant_pdl_enabled(void) { return fp8quant::pdl_enabled() ? 1 : 0; }

fp8quant_status_t fp8quant_check_device(int* major, int* minor) {
  fp8quant::DeviceInfo device{};
  if (const fp8quant_status_t st = fp8quant::current_device(&device); st != FP8QUANT_SUCCESS) return st;
  if (major != nullptr) *major = device.major;
  if (minor != nullptr) *minor = device.minor;
  int arch = 0;
  return fp8quant::kernel_arch(device, &arch);
}

}  // extern "C"
