// RMSNorm (+ residual add, + group quantization) for sm_90a (Hopper).
#include "kernels/rms_norm.cuh"

namespace fp8quant::sm90 {

struct Arch {};

fp8quant_status_t rms_norm(const NormProblem& problem, cudaStream_t stream) {
  return kernels::launch_rms_norm<Arch>(problem, stream);
}

}  // namespace fp8quant::sm90
