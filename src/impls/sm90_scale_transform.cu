// Scale transforms for sm_90a (Hopper).
#include "kernels/scale_transform.cuh"

namespace fp8quant::sm90 {

struct Arch {};

fp8quant_status_t scale_transform(const ScaleTransformProblem& problem, cudaStream_t stream) {
  return kernels::launch_scale_transform<Arch>(problem, stream);
}

}  // namespace fp8quant::sm90
