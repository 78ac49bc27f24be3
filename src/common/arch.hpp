// Per-architecture entry points: each kernel family is built once per architecture
// (src/impls/sm90_<op>.cu for sm_90a, src/impls/sm100_<op>.cu for sm_100f), and the C API picks
// one at run time from the device's compute capability (src/api/device.hpp).
#pragma once

#include <cuda_runtime.h>

#include "fp8quant/common.h"

// Declare `fp8quant_status_t sm90::name(const Problem&, cudaStream_t)` and its sm100 twin, in the
// namespace where the macro stands; each is defined by its architecture's impl file.
#define FP8QUANT_DECLARE_ARCH_ENTRIES(name, Problem)                   \
  namespace sm90 {                                                     \
  fp8quant_status_t name(const Problem& problem, cudaStream_t stream); \
  }                                                                    \
  namespace sm100 {                                                    \
  fp8quant_status_t name(const Problem& problem, cudaStream_t stream); \
  }
