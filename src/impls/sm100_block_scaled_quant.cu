// Block-scaled (MXFP8, NVFP4) quantization for datacenter Blackwell: sm_100f code, which runs on
// every compute capability 10.x (B200, B300). The e2m1 codes and RCEIL bytes come from the
// hardware conversions (src/common/math.cuh), NaN made +6 in the kernel.
#include "kernels/block_scaled_quant.cuh"

namespace fp8quant::sm100 {

struct Arch {};

fp8quant_status_t block_scaled_quant(const BlockScaledProblem& problem, cudaStream_t stream) {
  return kernels::launch_block_scaled_quant<Arch>(problem, stream);
}

}  // namespace fp8quant::sm100
