// The device the C API launches on.
#pragma once

#include "fp8quant/common.h"

namespace fp8quant {

// Compute capability of the current CUDA device; NO_DEVICE when there is none (or no driver).
fp8quant_status_t current_device_arch(int* major, int* minor);

}  // namespace fp8quant
