// MoE combine for sm_90a (Hopper).
#include "kernels/moe_combine.cuh"

namespace fp8quant::sm90 {

struct Arch {};

fp8quant_status_t moe_combine(const CombineProblem& problem, cudaStream_t stream) {
  return kernels::launch_moe_combine<Arch>(problem, stream);
}

}  // namespace fp8quant::sm90
