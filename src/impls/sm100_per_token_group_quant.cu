// Per-token-group quantization for datacenter Blackwell: sm_100f code, which runs on every
// compute capability 10.x (B200, B300). Same memory-bound kernel as sm_90a; its own Arch type
// keeps the two builds' symbols apart.
#include "kernels/per_token_group_quant.cuh"

namespace fp8quant::sm100 {

struct Arch {
  static constexpr int kBlockThreads = 256;
};

fp8quant_status_t per_token_group_quant(const QuantProblem& problem, cudaStream_t stream) {
  return kernels::launch_per_token_group_quant<Arch>(problem, stream);
}

}  // namespace fp8quant::sm100
