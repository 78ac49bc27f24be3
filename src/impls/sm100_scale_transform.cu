// Scale transforms for datacenter Blackwell: sm_100f code, run on every compute capability 10.x.
#include "kernels/scale_transform.cuh"

namespace fp8quant::sm100 {

struct Arch {};

fp8quant_status_t scale_transform(const ScaleTransformProblem& problem, cudaStream_t stream) {
  return kernels::launch_scale_transform<Arch>(problem, stream);
}

}  // namespace fp8quant::sm100
