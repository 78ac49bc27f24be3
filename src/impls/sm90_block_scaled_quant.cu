// Block-scaled (MXFP8, NVFP4) quantization for sm_90a (Hopper).
#include "kernels/block_scaled_quant.cuh"

namespace fp8quant::sm90 {

struct Arch {};

fp8quant_status_t block_scaled_quant(const BlockScaledProblem& problem, cudaStream_t stream) {
  return kernels::launch_block_scaled_quant<Arch>(problem, stream);
}

}  // namespace fp8quant::sm90
