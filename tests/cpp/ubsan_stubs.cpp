// The kernels' entry points for the C API tests built with UBSan (CMakeLists.txt): those tests
// run without a visible device, so every call that passes validation stops at
// FP8QUANT_ERROR_NO_DEVICE and none of these is reached.
#include <cstdlib>

#include "kernels/block_scaled_quant.hpp"
#include "kernels/moe_combine.hpp"
#include "kernels/moe_routing.hpp"
#include "kernels/per_block_quant.hpp"
#include "kernels/per_token_group_quant.hpp"
#include "kernels/rms_norm.hpp"
#include "kernels/scale_transform.hpp"

#define FP8QUANT_STUB_ENTRIES(name, Problem)                             \
  namespace sm90 {                                                       \
  fp8quant_status_t name(const Problem&, cudaStream_t) { std::abort(); } \
  }                                                                      \
  namespace sm100 {                                                      \
  fp8quant_status_t name(const Problem&, cudaStream_t) { std::abort(); } \
  }

namespace fp8quant {
FP8QUANT_STUB_ENTRIES(per_token_group_quant, QuantProblem)
FP8QUANT_STUB_ENTRIES(per_block_quant, BlockQuantProblem)
FP8QUANT_STUB_ENTRIES(scale_transform, ScaleTransformProblem)
FP8QUANT_STUB_ENTRIES(moe_routing, RoutingProblem)
FP8QUANT_STUB_ENTRIES(moe_combine, CombineProblem)
FP8QUANT_STUB_ENTRIES(rms_norm, NormProblem)
FP8QUANT_STUB_ENTRIES(block_scaled_quant, BlockScaledProblem)
}  // namespace fp8quant
