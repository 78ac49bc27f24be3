// The device the C API launches on, and how it launches.
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

// The architecture whose kernels run on `device`: 9 (sm_90a, compute capability 9.0) or 10
// (sm_100f, any 10.x); UNSUPPORTED_DEVICE, with a message naming both, for any other.
fp8quant_status_t kernel_arch(const DeviceInfo& device, int* arch);

// Whether kernels launch with programmatic dependent launch (fp8quant_set_pdl).
bool pdl_enabled();

}  // namespace fp8quant
