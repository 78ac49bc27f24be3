// MoE routing metadata for datacenter Blackwell: sm_100f code, run on every compute capability 10.x.
#include "kernels/moe_routing.cuh"

namespace fp8quant::sm100 {

struct Arch {};

fp8quant_status_t moe_routing(const RoutingProblem& problem, cudaStream_t stream) {
  return kernels::launch_moe_routing<Arch>(problem, stream);
}

}  // namespace fp8quant::sm100
