// The device the C API launches on, and how it launches (defined in src/api/common.cpp).
#pragma once

#include "common/error.hpp"
#include "fp8quant/common.h"

namespace fp8quant {

struct DeviceInfo {
  int major;  // compute capability
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

// Whether a kernel whose blocks meet at a grid barrier may launch cooperatively (the chunk
// routing's placement); FP8QUANT_COOPERATIVE=0 in the environment turns it off for the process.
bool cooperative_enabled();

// The architecture dispatch of a C API function: `sm90(problem, stream)` or
// `sm100(problem, stream)`, as kernel_arch decides for `device`.
template <typename Problem>
fp8quant_status_t launch_on(const DeviceInfo& device, const Problem& problem, cudaStream_t stream,
                            fp8quant_status_t (*sm90)(const Problem&, cudaStream_t),
                            fp8quant_status_t (*sm100)(const Problem&, cudaStream_t)) {
  int arch = 0;
  FP8QUANT_RETURN_IF_ERROR(kernel_arch(device, &arch));
  if (arch == 9) {
    return sm90(problem, stream);
  } else {  // 10: kernel_arch returns no other
    return sm100(problem, stream);
  }
}

// launch_on the current device, for a launcher that needs nothing else of it.
template <typename Problem>
fp8quant_status_t launch_for_arch(const Problem& problem, cudaStream_t stream,
                                  fp8quant_status_t (*sm90)(const Problem&, cudaStream_t),
                                  fp8quant_status_t (*sm100)(const Problem&, cudaStream_t)) {
  DeviceInfo device{};
  FP8QUANT_RETURN_IF_ERROR(current_device(&device));
  return launch_on(device, problem, stream, sm90, sm100);
}

// launch_on the current device, for a launcher that sizes its grid by the device's SMs: sets
// problem.sm_count first.
template <typename Problem>
fp8quant_status_t launch_for_arch_with_sm_count(Problem& problem, cudaStream_t stream,
                                                fp8quant_status_t (*sm90)(const Problem&, cudaStream_t),
                                                fp8quant_status_t (*sm100)(const Problem&, cudaStream_t)) {
  DeviceInfo device{};
  FP8QUANT_RETURN_IF_ERROR(current_device(&device));
  problem.sm_count = device.sm_count;
  return launch_on(device, problem, stream, sm90, sm100);
}

}  // namespace fp8quant
