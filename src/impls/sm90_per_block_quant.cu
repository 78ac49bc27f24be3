// Per-block (weight) quantization for sm_90a (Hopper).
#include "kernels/per_block_quant.cuh"

namespace fp8quant::sm90 {

struct Arch {};

fp8quant_status_t per_block_quant(const BlockQuantProblem& problem, cudaStream_t stream) {
  return kernels::launch_per_block_quant<Arch>(problem, stream);
}

}  // namespace fp8quant::sm90
