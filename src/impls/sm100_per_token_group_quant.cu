// Per-token-group quantization for sm_100a (Blackwell). Same memory-bound kernel as sm_90a,
// compiled for Blackwell; its own Arch type keeps the two builds' symbols apart.
#include "kernels/per_token_group_quant.cuh"

namespace fp8quant::sm100 {

struct Arch {
  static constexpr int kBlockThreads = 256;
};

cudaError_t per_token_group_quant(const QuantProblem& problem, cudaStream_t stream) {
  return kernels::launch_per_token_group_quant<Arch>(problem, stream);
}

}  // namespace fp8quant::sm100
