// Per-block (weight) quantization for datacenter Blackwell: sm_100f code, run on every compute
// capability 10.x. Its own Arch type keeps the two builds' symbols apart.
#include "kernels/per_block_quant.cuh"

namespace fp8quant::sm100 {

struct Arch {};

fp8quant_status_t per_block_quant(const BlockQuantProblem& problem, cudaStream_t stream) {
  return kernels::launch_per_block_quant<Arch>(problem, stream);
}

}  // namespace fp8quant::sm100
