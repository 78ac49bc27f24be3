// The device the C API launches on.
#pragma once

#include "fp8quant/common.h"

namespace fp8quant {

struct DeviceInfo {
  int major;     // compute capability
  int minor;
  int sm_count;  // streaming multiprocessors
};

// The current CUDA device's properties; NO_DEVICE when there is none (or no driver).
fp8quant_status_t current_device(DeviceInfo* device);

// The architecture whose kernels run on `device`: 9 (sm_90a) or 10 (sm_100a);
// UNSUPPORTED_DEVICE, with a message naming both, for any other compute capability.
fp8quant_status_t kernel_arch(const DeviceInfo& device, int* arch);

}  // namespace fp8quant
