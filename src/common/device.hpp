// The device the C API launches on.
#pragma once

#include "fp8quant/common.h"

namespace fp8quant {

// Compute capability of the current CUDA device; NO_DEVICE when there is none (or no driver).
fp8quant_status_t current_device_arch(int* major, int* minor);

// The architecture whose kernels run on the current device: 9 (sm_90a) or 10 (sm_100a);
// UNSUPPORTED_DEVICE, with a message naming both, for any other compute capability. The
// device's compute capability goes to *major / *minor where not null, whatever the status
// (unless the device cannot be queried).
fp8quant_status_t current_kernel_arch(int* arch, int* major = nullptr, int* minor = nullptr);

// Streaming multiprocessors of the current CUDA device.
fp8quant_status_t current_device_sm_count(int* count);

}  // namespace fp8quant
