// MoE combine for datacenter Blackwell: sm_100f code, run on every compute capability 10.x.
#include "kernels/moe_combine.cuh"

namespace fp8quant::sm100 {

struct Arch {};

fp8quant_status_t moe_combine(const CombineProblem& problem, cudaStream_t stream) {
  return kernels::launch_moe_combine<Arch>(problem, stream);
}

}  // namespace fp8quant::sm100
