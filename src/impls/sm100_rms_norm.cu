// RMSNorm (+ residual add, + group quantization) for datacenter Blackwell: sm_100f code, run on
// every compute capability 10.x.
#include "kernels/rms_norm.cuh"

namespace fp8quant::sm100 {

struct Arch {};

fp8quant_status_t rms_norm(const NormProblem& problem, cudaStream_t stream) {
  return kernels::launch_rms_norm<Arch>(problem, stream);
}

}  // namespace fp8quant::sm100
