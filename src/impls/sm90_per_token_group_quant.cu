// Per-token-group quantization for sm_90a (Hopper).
#include "kernels/per_token_group_quant.cuh"

namespace fp8quant::sm90 {

// Threads per block; a build-time knob for tuning (-DFP8QUANT_SM90_BLOCK_THREADS=...).
#ifndef FP8QUANT_SM90_BLOCK_THREADS
#define FP8QUANT_SM90_BLOCK_THREADS 256
#endif

struct Arch {
  // 256 threads: 8 warps, 32 groups of 128 in flight per block.
  static constexpr int kBlockThreads = FP8QUANT_SM90_BLOCK_THREADS;
};

fp8quant_status_t per_token_group_quant(const QuantProblem& problem, cudaStream_t stream) {
  return kernels::launch_per_token_group_quant<Arch>(problem, stream);
}

}  // namespace fp8quant::sm90
