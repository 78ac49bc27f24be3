// MoE routing metadata for sm_90a (Hopper).
#include "kernels/moe_routing.cuh"

namespace fp8quant::sm90 {

struct Arch {};

fp8quant_status_t moe_routing(const RoutingProblem& problem, cudaStream_t stream) {
  return kernels::launch_moe_routing<Arch>(problem, stream);
}

}  // namespace fp8quant::sm90
