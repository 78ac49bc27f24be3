// Per-token-group quantization for sm_90a (Hopper).
#include "kernels/per_token_group_quant.cuh"

namespace fp8quant::sm90 {

struct Arch {
  // 256 threads: 8 warps, 32 groups of 128 in flight per block.
  static constexpr int kBlockThreads = 256;
};

cudaError_t per_token_group_quant(const QuantProblem& problem, cudaStream_t stream) {
  return kernels::launch_per_token_group_quant<Arch>(problem, stream);
}

}  // namespace fp8quant::sm90
