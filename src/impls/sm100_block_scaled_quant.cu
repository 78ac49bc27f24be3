// Block-scaled (MXFP8, NVFP4) quantization for datacenter Blackwell: sm_100f code, which runs on every compute
// capability 10.x (B200, B300). The E8M0 bytes and e2m1 codes are computed on the bit pattern
// there too: the hardware conversions are not used yet (their NaN results are unchecked).
#include "kernels/block_scaled_quant.cuh"

namespace fp8quant::sm100 {

struct Arch {};

fp8quant_status_t block_scaled_quant(const BlockScaledProblem& problem, cudaStream_t stream) {
  return kernels::launch_block_scaled_quant<Arch>(problem, stream);
}

}  // namespace fp8quant::sm100
